"""Context parallelism for the VLM families follows the one-rank loss curve (same weights, same
data: LLaVA digits demo set, packed sequences with images of several sizes and videos).

Qwen2.5-VL: CP2; a checkpoint saved on one rank resumes at CP2; CP2 x DP2 with the kk_swap data
balancer (the balancer spreads samples over the 2 DP ranks, both CP ranks of a DP rank read the
same ones). Qwen3-VL (interleaved MRoPE, deepstack additions sliced like the decoder input): CP2.
Qwen3-VL-MoE: CP2 x EP2.
"""

from __future__ import annotations

import pytest

from loong_core.testing import assert_loss_curve, losses, read_metrics, run_train

STEPS = 5
COMMON = [f"trainer.train_iters={STEPS}", "trainer.log_interval=1", "trainer.eval_interval=0",
          "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.save_at_end=false",
          "optim.lr_decay_iters=20"]
CP2 = "parallel.context_parallel_size=2"


def _run(overrides: list[str], nproc: int, layout: str) -> None:
    proc = run_train(overrides, nproc=nproc)
    assert layout in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


@pytest.mark.multirank
def test_qwen2_5_vl_cp2_cp1_checkpoint_and_balanced_dp2(tmp_path):
    common = ["experiment=qwen2_5_vl_debug", *COMMON]
    run_train([*common, "trainer.save_interval=3", f"trainer.run_dir={tmp_path / 'ref'}"])
    ref = losses(tmp_path / "ref")
    assert ref[STEPS] < ref[1] - 0.1  # the weights move: a frozen model could not pass

    _run([*common, CP2, f"trainer.run_dir={tmp_path / 'cp2'}"], 2, "CP=2 EP=1 DP=1")
    assert_loss_curve(losses(tmp_path / "cp2"), ref, range(1, STEPS + 1), "qwen2_5_vl cp2")

    # The one-rank checkpoint (weights, optimizer, data position) resumes under CP2.
    _run([*common, CP2, f"trainer.run_dir={tmp_path / 'cp2_from_cp1'}",
          f"trainer.resume={tmp_path / 'ref' / 'checkpoints' / 'iter_0000003'}"], 2, "CP=2")
    assert_loss_curve(losses(tmp_path / "cp2_from_cp1"), ref, range(4, STEPS + 1), "qwen2_5_vl cp2 from cp1")

    # The balancer sees DP = 2 (not DP x CP = 4): each DP rank gets 2 of the 4 samples, one micro
    # batch of 2; with DP x CP ranks it could not give a micro batch of 2 to each.
    _run([*common, CP2, f"trainer.run_dir={tmp_path / 'cp2_dp2'}"], 4,
         "CP=2 EP=1 DP=2")
    assert_loss_curve(losses(tmp_path / "cp2_dp2"), ref, range(1, STEPS + 1), "qwen2_5_vl cp2 x dp2 kk_swap")
    rows = read_metrics(tmp_path / "cp2_dp2")
    assert all(r["balance/max_over_mean_after"] <= r["balance/max_over_mean_before"] for r in rows)


@pytest.mark.multirank
def test_qwen3_vl_cp2(tmp_path):
    common = ["experiment=qwen3_vl_debug", *COMMON]
    run_train([*common, f"trainer.run_dir={tmp_path / 'ref'}"])
    ref = losses(tmp_path / "ref")
    assert ref[STEPS] < ref[1] - 0.1
    _run([*common, CP2, f"trainer.run_dir={tmp_path / 'cp2'}"], 2, "CP=2 EP=1 DP=1")
    assert_loss_curve(losses(tmp_path / "cp2"), ref, range(1, STEPS + 1), "qwen3_vl cp2")


@pytest.mark.multirank
def test_qwen3_vl_moe_cp2_x_ep2(tmp_path):
    """Qwen3-VL-MoE: the experts split over 2 expert-parallel ranks and the sequence over 2
    context-parallel ranks (the vision tower whole on each) follow the one-rank curve, and the
    foundation's router statistics are logged with the VLM's loss and accuracy. Both start from
    a one-rank checkpoint (megatron-core initialises the experts of each EP rank from its own
    seed)."""
    run_train(["experiment=qwen3_vl_moe_debug", *COMMON[1:], "trainer.train_iters=1", "trainer.save_at_end=true",
               f"trainer.run_dir={tmp_path / 'init'}"])
    common = ["experiment=qwen3_vl_moe_debug", *COMMON,
              f"trainer.init_from={tmp_path / 'init' / 'checkpoints' / 'iter_0000001'}"]
    run_train([*common, f"trainer.run_dir={tmp_path / 'ref'}"])
    ref = losses(tmp_path / "ref")
    assert ref[STEPS] < ref[1] - 0.1
    assert all(r["moe_imbalance"] >= 1.0 for r in read_metrics(tmp_path / "ref"))
    _run([*common, CP2, "parallel.expert_model_parallel_size=2", f"trainer.run_dir={tmp_path / 'cp2_ep2'}"],
         2, "CP=2 EP=2 DP=1")
    assert_loss_curve(losses(tmp_path / "cp2_ep2"), ref, range(1, STEPS + 1), "qwen3_vl_moe cp2 x ep2")
