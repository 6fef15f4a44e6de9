"""InternVL computes transformers' ``InternVLForConditionalGeneration``: the projector's 2x2 merge
is its ``pixel_shuffle``, logits of tiny random models (images of 2 and 3 tiles) match within 1e-4
(fp32) at TP1 and TP2 for an InternViT-300M-style tower over Qwen2 text and an InternViT-6B-style
tower (RMSNorm, whole-projection q/k norms, a final LayerNorm, no q/k/v biases) over Qwen3 text,
HF -> loong -> HF is bit-exact, both checkpoint layouts read, the composition over a swapped
foundation learns vlm_digits, and its 5-step curve with the encoder at TP1 under a TP2 (+SP)
foundation and at CP2 equals one rank's."""

from __future__ import annotations

import os

import pytest
import torch

from loong_vlm.internvl import testing
from loong_vlm.parity import launch

TOLERANCE = 1e-4
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("internvl")
    return {v: testing.write_hf_model(root / v, v, seed=i) for i, v in enumerate(testing.VARIANTS)}


def parity(hf_dirs, out, nproc: int, *flags: str) -> dict:
    return launch("loong_vlm.internvl.testing", out, [*hf_dirs.values(), *flags], nproc)


def test_projector_merge_is_transformers_pixel_shuffle():
    from transformers.models.internvl.modeling_internvl import InternVLModel

    from loong_core.patches import merge_patches

    features = torch.randn(3, 6, 4, 5)  # [n, rows, cols, c]
    ref = InternVLModel.pixel_shuffle(None, features, scale_factor=0.5).reshape(3, -1, 20)
    assert torch.equal(merge_patches(features.reshape(3, 24, 5), (6, 4), 2), ref)


def test_logits_match_transformers_at_tp1(hf_dirs, tmp_path):
    diffs = parity(hf_dirs, tmp_path / "tp1.json", 1)
    assert set(diffs) == set(testing.VARIANTS) and max(diffs.values()) < TOLERANCE, diffs


@pytest.mark.multirank
def test_logits_match_transformers_at_tp2(hf_dirs, tmp_path):
    diffs = parity(hf_dirs, tmp_path / "tp2.json", 2, "--tp", "2")
    assert max(diffs.values()) < TOLERANCE, diffs


@pytest.mark.multirank
def test_hf_to_loong_at_tp2_to_hf_is_bit_exact_in_bf16(hf_dirs, tmp_path):
    """The 6B-style tower over Qwen3 text (q/k norm weights sharded by heads) in bf16."""
    from loong_llm.hf.testing import bf16_copy, convert_round_trip

    back = convert_round_trip("internvl", bf16_copy(hf_dirs["qwen3_6b_style"], tmp_path / "src"), tmp_path,
                              "--tp", "2")
    assert any(".lambda_1" in name for name in back)


def test_both_checkpoint_layouts_read(hf_dirs, tmp_path):
    """``save_pretrained``'s published names and transformers 5's module names
    (``model.vision_tower.*``, ``model.language_model.*``, ``lm_head``) give the same tensors."""
    from safetensors.torch import load_file, save_file

    from loong_vlm.internvl.hf_adapter import InternVLHFAdapter

    source = hf_dirs["qwen2"]
    tensors = load_file(source / "model.safetensors")
    renamed = {}
    for name, value in tensors.items():
        if name.startswith("language_model.model."):
            name = "model.language_model." + name[len("language_model.model."):]
        elif name.startswith("language_model.lm_head."):
            name = name[len("language_model."):]
        else:
            name = "model." + name
        renamed[name] = value
    (tmp_path / "other").mkdir()
    save_file(renamed, tmp_path / "other" / "model.safetensors")
    published, other = InternVLHFAdapter().reader(source), InternVLHFAdapter().reader(tmp_path / "other")
    assert published.keys() == other.keys() == sorted(tensors)
    assert all(torch.equal(published.get(n), other.get(n)) for n in tensors)


def test_swapped_foundation_reads_held_out_digits(tmp_path):
    """``experiment=vlm_digits_internvl`` with its Qwen2 decoder swapped for Qwen3 in one override
    reaches >= 90% held-out accuracy in 200 steps (0.98 measured; about 18 s on 2 cores)."""
    from loong_core.testing import read_metrics, run_train

    run_train(["experiment=vlm_digits_internvl", "model@model.foundation=qwen3_debug", "trainer.train_iters=200",
               "trainer.eval_interval=200", "trainer.progress_bar=false", "trainer.tensorboard=false",
               "trainer.save_at_end=false", f"trainer.run_dir={tmp_path}"])
    assert "name: qwen3" in (tmp_path / "config.yaml").read_text()
    valid = {r["step"]: r for r in read_metrics(tmp_path, "valid")}
    assert valid[0]["accuracy"] < 0.2 and valid[200]["accuracy"] >= 0.9, valid


LAYOUT_STEPS = 5
LAYOUTS = {  # every one on 2 ranks (the encoder's uniform TP2 forward: the TP2 parity check)
    "encoder_tp1_under_tp2": ["parallel=tp2", "model.encoder.tensor_model_parallel_size=1"],
    "cp2": ["parallel.context_parallel_size=2"],
}


@pytest.fixture(scope="module")
def internvl_curve(tmp_path_factory):
    """``vlm_digits_internvl``: a 1-step checkpoint and the one-rank curve of 5 more steps from it
    (the q/k-norm tower's TP2 forward is in the TP2 parity check; an encoder narrower than the
    foundation refuses q/k norms)."""
    from loong_core.testing import losses, run_train

    root = tmp_path_factory.mktemp("internvl_layouts")
    base = ["experiment=vlm_digits_internvl", "trainer.log_interval=1",
            "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.eval_interval=0",
            "trainer.eval_at_start=false"]
    run_train([*base, "trainer.train_iters=1", f"trainer.run_dir={root / 'init'}"])
    common = [*base, f"trainer.init_from={root / 'init' / 'checkpoints' / 'iter_0000001'}",
              f"trainer.train_iters={LAYOUT_STEPS}", "optim.lr_decay_iters=20", "trainer.save_at_end=false"]
    run_train([*common, f"trainer.run_dir={root / 'ref'}"])
    return common, losses(root / "ref"), root


@pytest.mark.multirank
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_follows_the_one_rank_curve(internvl_curve, layout):
    from loong_core.testing import assert_loss_curve, losses, run_train

    common, ref, root = internvl_curve
    assert ref[LAYOUT_STEPS] < ref[1] - 0.1  # the weights move
    run_train([*common, *LAYOUTS[layout], f"trainer.run_dir={root / layout}"], nproc=2)
    assert_loss_curve(losses(root / layout), ref, range(1, LAYOUT_STEPS + 1), f"internvl {layout}")
