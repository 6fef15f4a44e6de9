"""Qwen3-VL computes transformers' ``Qwen3VLForConditionalGeneration``: position ids equal
``get_rope_index``, interleaved MRoPE angles equal its rotary embedding, logits of a tiny random
model with two images of different sizes and a video match within 1e-4 (fp32) at TP1 and TP2,
and HF -> loong -> HF through ``loong convert`` is bit-exact. Qwen3-VL-MoE
(``Qwen3VLMoeForConditionalGeneration``, stacked experts) likewise at EP2 and TP2 (SP), with
its round trip through an EP2 checkpoint in bf16."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from loong_vlm.parity import launch
from loong_vlm.qwen3_vl import testing

TOLERANCE = 1e-4
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return testing.write_hf_model(tmp_path_factory.mktemp("qwen3_vl") / "hf")


@pytest.fixture(scope="module")
def moe_hf_dir(tmp_path_factory):
    return testing.write_hf_model(tmp_path_factory.mktemp("qwen3_vl_moe") / "hf", seed=1, moe=True)


def parity(hf_dir, out, nproc: int, *flags: str) -> dict:
    return launch("loong_vlm.qwen3_vl.testing", out, [hf_dir, *flags], nproc)


def test_position_ids_match_transformers_get_rope_index():
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    batch = testing.sample_batch()
    reference = Qwen3VLModel(testing.hf_config())
    expected, _ = reference.get_rope_index(batch["tokens"], batch["mm_token_type_ids"], batch["image_grid_thw"],
                                           batch["video_grid_thw"])
    assert torch.equal(testing.loong_position_ids(batch), expected.transpose(0, 1))


def test_interleaved_mrope_matches_transformers_rotary(mcore_single_rank):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    from loong_vlm.qwen3_vl.rope import InterleavedMRoPE

    positions = testing.loong_position_ids(testing.sample_batch()).transpose(0, 1)  # [3, b, s]
    cos, sin = Qwen3VLTextRotaryEmbedding(testing.hf_config().text_config)(torch.zeros(1), positions)
    angles = InterleavedMRoPE(kv_channels=32, rotary_percent=1.0, rotary_base=5000)(positions, [6, 5, 5])
    assert angles.shape == (positions.shape[2], positions.shape[1], 1, 32)
    ours = angles[:, :, 0].transpose(0, 1)  # [b, s, d]
    assert (ours.cos() - cos).abs().max() < 1e-6 and (ours.sin() - sin).abs().max() < 1e-6


def test_logits_match_transformers_at_tp1(hf_dir, tmp_path):
    assert parity(hf_dir, tmp_path / "tp1.json", 1)["max_abs_diff"] < TOLERANCE


@pytest.mark.multirank
def test_logits_match_transformers_at_tp2_with_and_without_sequence_parallel(hf_dir, tmp_path):
    diffs = parity(hf_dir, tmp_path / "tp2.json", 2, "--tp", "2", "--sp")
    assert diffs["max_abs_diff"] < TOLERANCE and diffs["max_abs_diff_sp"] < TOLERANCE


@pytest.mark.multirank
@pytest.mark.parametrize("flags", [("--ep", "2"), ("--tp", "2", "--sp")], ids=["ep2", "tp2_sp"])
def test_moe_logits_match_transformers_when_sharded(moe_hf_dir, tmp_path, flags):
    """EP2 (every non-expert weight whole on each rank, as at TP1) and TP2 with sequence
    parallelism (megatron-core's MoE under TP needs it)."""
    assert all(d < TOLERANCE for d in parity(moe_hf_dir, tmp_path / "out.json", 2, *flags).values())


def round_trip(hf_dir, tmp_path, *layout: str, family: str = "qwen3_vl") -> None:
    """HF -> loong (at ``layout``) -> HF through ``loong convert``: same tensors, same config.json."""
    from loong_llm.hf.testing import convert_round_trip

    back = convert_round_trip(family, hf_dir, tmp_path, *layout)
    assert any(name.startswith("model.visual.deepstack") for name in back)


def test_hf_to_loong_to_hf_is_bit_exact_in_bf16(hf_dir, tmp_path):
    """A bf16 source (as published) comes back in bf16: the dtype recorded at import."""
    from loong_llm.hf.testing import bf16_copy

    round_trip(bf16_copy(hf_dir, tmp_path / "bf16_src"), tmp_path)


@pytest.mark.multirank
def test_hf_to_loong_at_tp2_to_hf_is_bit_exact(hf_dir, tmp_path):
    round_trip(hf_dir, tmp_path, "--tp", "2")  # the TP2 checkpoint reshards to one rank on export


@pytest.mark.multirank
def test_moe_hf_to_loong_at_ep2_to_hf_is_bit_exact_in_bf16(moe_hf_dir, tmp_path):
    """Stacked experts split over 2 EP ranks and stacked again on export, in the source's bf16."""
    from loong_llm.hf.testing import bf16_copy

    round_trip(bf16_copy(moe_hf_dir, tmp_path / "bf16_src"), tmp_path, "--ep", "2", family="qwen3_vl_moe")


def test_stacked_experts_read_in_both_layouts_and_write_transformers_layout(tmp_path):
    """Per-expert views of ``gate_up_proj [E, 2I, H]`` / ``down_proj [E, H, I]`` (transformers'
    layout) and of their transposes (the published checkpoints'), and the stacker's inverse."""
    from safetensors.torch import save_file

    from loong_llm.hf.io import SafetensorsReader
    from loong_llm.hf.stacked_experts import ExpertStacker, StackedExpertsReader

    experts, inter, hidden = 3, 5, 8
    gate_up, down = torch.randn(experts, 2 * inter, hidden), torch.randn(experts, hidden, inter)
    mlp = "model.language_model.layers.0.mlp.experts."
    for layout, (a, b) in {"transformers": (gate_up, down),
                           "published": (gate_up.transpose(1, 2), down.transpose(1, 2))}.items():
        directory = tmp_path / layout
        directory.mkdir()
        save_file({mlp + "gate_up_proj": a.contiguous(), mlp + "down_proj": b.contiguous(),
                   "lm_head.weight": torch.ones(2)}, directory / "model.safetensors")
        reader = StackedExpertsReader(SafetensorsReader(directory), hidden)
        assert len(reader.keys()) == 3 * experts + 1 and "lm_head.weight" in reader.keys()
        stacker = ExpertStacker(experts)
        written = []
        for e in range(experts):
            gate, up = reader.get(f"{mlp}{e}.gate_proj.weight"), reader.get(f"{mlp}{e}.up_proj.weight")
            assert torch.equal(torch.cat([gate, up]), gate_up[e]), layout
            assert torch.equal(reader.get(f"{mlp}{e}.down_proj.weight"), down[e]), layout
            for part, tensor in (("gate_proj", gate), ("up_proj", up), ("down_proj", down[e])):
                written += stacker.add(f"{mlp}{e}.{part}.weight", tensor)
        stacker.close()
        assert [n for n, _ in written] == [mlp + "gate_up_proj", mlp + "down_proj"]
        assert torch.equal(written[0][1], gate_up) and torch.equal(written[1][1], down)


def deepstack_gradients(recompute: bool, state: dict | None = None) -> tuple[dict, dict]:
    """Parameter gradients of one training step of a tiny random Qwen3-VL (and its weights)."""
    from loong_llm.families.qwen3.config import Qwen3Config
    from loong_vlm.qwen3_vl.config import Qwen3ViTConfig, Qwen3VLConfig
    from loong_vlm.qwen3_vl.model import Qwen3VLProvider

    config = Qwen3VLConfig(
        name="qwen3_vl", image_token_id=testing.IMAGE, video_token_id=testing.VIDEO,
        encoder=Qwen3ViTConfig(name="qwen3_vit", patch_size=4, num_layers=2, hidden_size=32, num_attention_heads=4,
                               ffn_hidden_size=64, out_hidden_size=64, num_position_embeddings=36,
                               deepstack_visual_indexes=[0, 1], recompute_granularity="full" if recompute else None),
        foundation=Qwen3Config(name="qwen3", num_layers=2, hidden_size=64, num_attention_heads=4,
                               num_query_groups=2, kv_channels=32, ffn_hidden_size=96, vocab_size=testing.VOCAB,
                               position_embedding_type="mrope", mrope_section=[6, 5, 5]))
    provider = Qwen3VLProvider(config)
    megatron_config = provider.megatron_config({})
    if recompute:
        megatron_config.recompute_granularity, megatron_config.recompute_method = "full", "uniform"
        megatron_config.recompute_num_layers = 1
    model = provider.build_megatron_model(megatron_config, True, True, None)
    if state is not None:
        model.load_state_dict(state)
    batch = testing.sample_batch()
    tokens = batch["tokens"]
    batch.update(position_ids=testing.loong_position_ids(batch), labels=torch.roll(tokens, -1, 1),
                 loss_mask=torch.ones(tokens.shape))
    output, loss_func = provider.forward_step(model, batch)
    loss_func(output)[0].backward()
    return {name: p.grad for name, p in model.named_parameters()}, model.state_dict()


def test_deepstack_gradients_reach_the_encoder_and_survive_recompute(mcore_single_rank):
    grads, state = deepstack_gradients(recompute=False)
    assert all(g is not None for g in grads.values())
    assert grads["encoder.deepstack_mergers.0.linear_fc2.weight"].abs().sum() > 0
    assert grads["encoder.deepstack_mergers.1.linear_fc2.weight"].abs().sum() > 0
    recomputed, _ = deepstack_gradients(recompute=True, state=state)  # encoder and decoder, full
    assert max((recomputed[name] - g).abs().max() for name, g in grads.items()) < 1e-6


def test_deepstack_layers_must_be_on_the_first_pipeline_stage():
    from loong_core.errors import ConfigError
    from loong_vlm.qwen3_vl.deepstack import DeepstackInjector

    second_stage = SimpleNamespace(layers=[SimpleNamespace(layer_number=3), SimpleNamespace(layer_number=4)])
    with pytest.raises(ConfigError, match="first pipeline stage"):
        DeepstackInjector(second_stage, 2, sequence_parallel=False)


def test_adapter_reads_configs_saved_by_older_transformers():
    """transformers 4.57 wrote ``rope_theta`` beside ``rope_scaling`` (with the MRoPE sections)."""
    from loong_vlm.qwen3_vl.hf_adapter import Qwen3VLHFAdapter

    hf = testing.hf_config().to_dict()
    text = hf["text_config"]
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True}
    text["rope_theta"] = 5000000
    del text["rope_parameters"]
    fields = Qwen3VLHFAdapter().config_from_hf(hf)
    assert fields["foundation"]["rotary_base"] == 5000000.0
    assert fields["foundation"]["mrope_section"] == [6, 5, 5]
    assert fields["encoder"]["deepstack_visual_indexes"] == [0, 2]
    assert (fields["image_token_id"], fields["video_token_id"]) == (testing.IMAGE, testing.VIDEO)


def test_qwen3_vl_debug_experiment_trains(tmp_path):
    """Three steps of ``experiment=qwen3_vl_debug`` on the LLaVA demo set (packed, images and videos)."""
    import math

    from loong_core.testing import read_metrics, run_train

    run_train(["experiment=qwen3_vl_debug", "trainer.train_iters=3", "trainer.log_interval=1",
               "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.save_at_end=false",
               "trainer.eval_interval=0", f"trainer.run_dir={tmp_path}"])
    train = read_metrics(tmp_path)
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in train) and train[-1]["loss"] < train[0]["loss"]
    assert "video_layout: qwen3_vl" in (tmp_path / "config.yaml").read_text()  # timestamped video frames
