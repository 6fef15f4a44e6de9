"""diffusers weights -> loong checkpoint -> diffusers weights is bit-exact, also through training."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file

from loong_core.testing import run_train
from loong_diffusion.families.qwen_image.adapter import QwenImageAdapter
from loong_diffusion.families.qwen_image.config import QwenImageConfig
from loong_diffusion.families.qwen_image.model import QwenImageProvider
from loong_diffusion.families.wan.adapter import WanAdapter
from loong_diffusion.families.wan.config import WanConfig
from loong_diffusion.families.wan.model import WanProvider

FAMILIES = {
    "wan": (WanProvider, WanConfig, WanAdapter,
            dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, text_dim=32,
                 freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=32)),
    "qwen_image": (QwenImageProvider, QwenImageConfig, QwenImageAdapter,
                   dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=[4, 6, 6])),
}


def _weights(directory):
    files = sorted(directory.glob("*.safetensors"))
    assert files, f"no safetensors in {directory}"
    out = {}
    for f in files:
        out.update(load_file(f))
    return out


def _assert_bit_exact(a_dir, b_dir):
    a, b = _weights(a_dir), _weights(b_dir)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    config_a, config_b = (json.loads((d / "config.json").read_text()) for d in (a_dir, b_dir))
    assert {k: v for k, v in config_a.items() if not k.startswith("_")} == \
        {k: v for k, v in config_b.items() if not k.startswith("_")}


@pytest.fixture(params=list(FAMILIES))
def reference_dir(request, tmp_path):
    """A randomly initialised tiny diffusers model saved with ``save_pretrained``."""
    provider_cls, config_cls, adapter_cls, kwargs = FAMILIES[request.param]
    torch.manual_seed(0)
    model = provider_cls(config_cls(**kwargs)).build_torch_model()
    model.save_pretrained(str(tmp_path / "reference"))
    return request.param, tmp_path / "reference", adapter_cls()


def test_diffusers_to_loong_to_diffusers_is_bit_exact(reference_dir, tmp_path):
    family, reference, adapter = reference_dir
    checkpoint = adapter.hf_to_loong(reference, tmp_path / "loong" / "iter_0000000")
    assert (checkpoint / "loong_complete.json").is_file()
    adapter.loong_to_hf(checkpoint, tmp_path / "back")
    _assert_bit_exact(reference, tmp_path / "back")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_diffusers_model_round_trips_in_bf16(family, tmp_path):
    """A bf16 checkpoint (as published) comes back in bf16, bit-exact: the source dtype is
    recorded at import and written back unless ``dtype`` says otherwise."""
    provider_cls, config_cls, adapter_cls, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        provider_cls(config_cls(**kwargs)).build_torch_model().to(torch.bfloat16).save_pretrained(
            str(tmp_path / "reference"))
    adapter = adapter_cls()
    checkpoint = adapter.hf_to_loong(tmp_path / "reference", tmp_path / "loong" / "iter_0000000")
    adapter.loong_to_hf(checkpoint, tmp_path / "back")
    _assert_bit_exact(tmp_path / "reference", tmp_path / "back")
    assert {t.dtype for t in _weights(tmp_path / "back").values()} == {torch.bfloat16}
    adapter.loong_to_hf(checkpoint, tmp_path / "fp32", dtype="float32")
    assert {t.dtype for t in _weights(tmp_path / "fp32").values()} == {torch.float32}


def test_loaded_model_has_the_reference_names_and_values(reference_dir):
    family, reference, adapter = reference_dir
    provider_cls, config_cls, _, kwargs = FAMILIES[family]
    model = provider_cls(config_cls(**kwargs, pretrained=str(reference))).build_torch_model()
    weights = _weights(reference)
    assert set(model.state_dict()) == set(weights)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())


def test_a_training_checkpoint_exports_the_diffusers_layout(tmp_path, quiet):
    """Start a run from converted weights with lr 0: the run's checkpoint exports the same bits."""
    torch.manual_seed(0)
    provider_cls, config_cls, adapter_cls, kwargs = FAMILIES["wan"]
    provider_cls(config_cls(**kwargs)).build_torch_model().save_pretrained(str(tmp_path / "reference"))
    adapter = adapter_cls()
    init = adapter.hf_to_loong(tmp_path / "reference", tmp_path / "converted" / "iter_0000000")
    run = tmp_path / "run"
    run_train(["experiment=wan_debug", *quiet, "trainer.train_iters=1", "optim.lr=0.0", "optim.min_lr=0.0",
               "trainer.eval_interval=0", f"trainer.init_from={init}", f"trainer.run_dir={run}"])
    adapter.loong_to_hf(run / "checkpoints" / "iter_0000001", tmp_path / "back")
    _assert_bit_exact(tmp_path / "reference", tmp_path / "back")
