"""Heterogeneous parallelism: the encoder's TP size, data layout and recompute are its own, and
training follows the one-rank loss and gradient-norm curve in every layout."""

from __future__ import annotations

import pytest
import torch

from loong_core.errors import ConfigError
from loong_core.testing import read_metrics, run_train

STEPS = 3


def _encoder(**fields):
    from loong_vlm.config import ViTConfig

    return ViTConfig(name="vit", image_size=16, num_channels=1, patch_size=4, num_layers=2, hidden_size=32,
                     num_attention_heads=2, ffn_hidden_size=64, **fields)


@pytest.mark.parametrize(("fields", "foundation_tp", "message"), [
    ({"tensor_model_parallel_size": 3}, 2, "must divide the foundation's"),
    ({"tensor_model_parallel_size": 4}, 2, "must divide the foundation's"),
    ({}, 4, "num_attention_heads \\(2\\) must be divisible"),
    ({"tensor_model_parallel_size": 1, "attention_dropout": 0.1}, 2, "set model.encoder.data_layout=shard"),
    ({"data_layout": "scatter"}, 2, "is not one of replicate, shard"),
    ({"recompute_granularity": "full", "recompute_num_layers": 3}, 1, "must be in 1..2"),
])
def test_bad_encoder_parallel_settings_name_the_key(fields, foundation_tp, message):
    from loong_vlm.encoder_parallel import plan_encoder_parallel
    from loong_vlm.encoders.spec import encoder_transformer_config

    with pytest.raises(ConfigError, match=message):
        plan_encoder_parallel(_encoder(**fields), {"tensor_model_parallel_size": foundation_tp})
        encoder_transformer_config(_encoder(**fields), {"tensor_model_parallel_size": foundation_tp})


def test_shard_layout_refuses_dynamic_resolution_encoders():
    from loong_vlm.encoder_parallel import plan_encoder_parallel
    from loong_vlm.qwen3_vl.config import Qwen3ViTConfig

    cfg = Qwen3ViTConfig(name="qwen3_vit", tensor_model_parallel_size=1, data_layout="shard")
    with pytest.raises(ConfigError, match="use model.encoder.data_layout=replicate"):
        plan_encoder_parallel(cfg, {"tensor_model_parallel_size": 2})


def test_encoder_tp_and_recompute_are_independent_of_the_foundation():
    from loong_vlm.encoders.spec import encoder_transformer_config

    foundation = {"tensor_model_parallel_size": 2, "recompute_granularity": None}
    config = encoder_transformer_config(
        _encoder(tensor_model_parallel_size=1, recompute_granularity="full", recompute_method="block"), foundation)
    assert (config.tensor_model_parallel_size, config.recompute_granularity) == (1, "full")
    assert (config.recompute_method, config.recompute_num_layers) == ("block", 1)
    config = encoder_transformer_config(_encoder(), {**foundation, "recompute_granularity": "full"})
    assert (config.tensor_model_parallel_size, config.recompute_granularity) == (2, None)


def test_uniform_layout_builds_the_plain_encoder_class(mcore_single_rank):
    from loong_vlm.encoder_parallel import build_encoder, plan_encoder_parallel, projector_config
    from loong_vlm.encoders.vit import ViTEncoder

    cfg = _encoder(tensor_model_parallel_size=1, data_layout="shard")
    plan = plan_encoder_parallel(cfg, {"tensor_model_parallel_size": 1})
    assert (plan.replicas, plan.heterogeneous, plan.tp_group) == (1, False, None)
    assert type(build_encoder(plan, ViTEncoder, cfg, {})) is ViTEncoder
    assert projector_config(plan, "config") == "config"


def test_checkpoint_replicas_of_other_encoder_blocks_are_not_main():
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from loong_vlm.encoder_sharding import mark_replicas

    def entry(replica_id):
        return ShardedTensor.from_rank_offsets("w", torch.zeros(2), replica_id=replica_id)

    state = {"a": entry(0), "b": {"c": entry((0, 1, 0))}}
    mark_replicas(state, 1)
    assert state["a"].replica_id == (1, 0) and state["b"]["c"].replica_id == (1, 0, 1, 0)


# -- end to end on 2 ranks: TP2 foundation, encoder at TP1 --------------------------------------
COMMON = ["experiment=vlm_debug", "trainer.log_interval=1", "trainer.progress_bar=false",
          "trainer.tensorboard=false", "trainer.eval_interval=0"]
ENCODER_TP1 = ["parallel=tp2", "model.encoder.tensor_model_parallel_size=1"]
LAYOUTS = {
    "replicate": [*ENCODER_TP1],
    "shard_full_recompute": [*ENCODER_TP1, "model.encoder.data_layout=shard",
                             "model.encoder.recompute_granularity=full"],
}


def _curve(run_dir) -> dict[int, tuple[float, float]]:
    """``step -> (loss, grad_norm)``."""
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in read_metrics(run_dir)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A 2-step checkpoint and the one-rank curve of 3 more steps from it."""
    root = tmp_path_factory.mktemp("encoder_parallel")
    run_train([*COMMON, f"trainer.run_dir={root / 'init'}", "trainer.train_iters=2"])
    common = [*COMMON, f"trainer.init_from={root / 'init' / 'checkpoints' / 'iter_0000002'}",
              f"trainer.train_iters={STEPS}", "optim.lr_decay_iters=20"]
    run_train([*common, f"trainer.run_dir={root / 'ref'}", "trainer.save_at_end=false"])
    return common, _curve(root / "ref"), root


def _assert_same_curve(got: dict, ref: dict, label: str) -> None:
    assert sorted(got) == list(range(1, STEPS + 1)), (label, got)
    for step, (loss, grad_norm) in ref.items():
        # The grad norm is where a double-counted encoder replica shows (about 2e-4 relative).
        assert got[step][0] == pytest.approx(loss, abs=2e-5, rel=2e-5), (label, step, got, ref)
        assert got[step][1] == pytest.approx(grad_norm, rel=2e-5), (label, step, got, ref)
    assert abs(ref[STEPS][0] - ref[1][0]) > 1e-3  # the weights move


def test_encoder_recompute_follows_the_curve(reference):
    common, ref, root = reference
    run_train([*common, "model.encoder.recompute_granularity=selective", f"trainer.run_dir={root / 'recompute'}",
               "trainer.save_at_end=false"])
    _assert_same_curve(_curve(root / "recompute"), ref, "selective recompute")


@pytest.mark.multirank
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_encoder_tp1_under_foundation_tp2_follows_the_one_rank_curve(reference, layout):
    common, ref, root = reference
    run_train([*common, *LAYOUTS[layout], f"trainer.run_dir={root / layout}", "trainer.save_at_end=false"],
              nproc=2)
    _assert_same_curve(_curve(root / layout), ref, layout)


def _weights(checkpoint) -> dict[str, torch.Tensor]:
    """Model tensors of a dist checkpoint (read back through torch.distributed.checkpoint)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = checkpoint.parent / f"{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint, path)
    state = torch.load(path, weights_only=False)
    return {k: v for k, v in state.items() if torch.is_tensor(v) and not k.startswith("optimizer")}


@pytest.mark.multirank
def test_frozen_encoder_stays_fixed_under_the_sharded_layout_and_saves(reference):
    common, _, root = reference
    run_dir = root / "frozen"
    run_train([*common, *LAYOUTS["shard_full_recompute"], "model.encoder.freeze=true",
               f"trainer.run_dir={run_dir}"], nproc=2)
    before = _weights(root / "init" / "checkpoints" / "iter_0000002")
    after = _weights(run_dir / "checkpoints" / f"iter_{STEPS:07d}")
    encoder = [k for k in before if k.startswith("encoder.")]
    assert len(encoder) >= 10 and sorted(after) == sorted(before)
    for key in encoder:
        assert torch.equal(after[key], before[key]), key
    assert not torch.equal(after["projector.linear_fc1.weight"], before["projector.linear_fc1.weight"])
