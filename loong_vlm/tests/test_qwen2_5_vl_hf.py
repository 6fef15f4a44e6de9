"""Qwen2.5-VL against transformers: logits of a tiny random model with two images of different
sizes and a video match within 1e-4 (fp32) at TP1 and TP2; ``loong convert`` HF -> loong -> HF is
bit-exact; a published-style config.json reads as the shipped 3B model YAML; a converted checkpoint
trains like online HF loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loong_core.testing import losses, run_train
from loong_vlm.parity import launch
from loong_vlm.qwen2_5_vl.testing import write_hf_model

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_model(tmp_path_factory.mktemp("hf") / "qwen2_5_vl", seed=0)


def _parity(hf_dir: Path, out: Path, tp: int, *flags: str) -> float:
    return launch("loong_vlm.qwen2_5_vl.testing", out, [hf_dir, "--tp", tp, *flags], tp)["max_abs_diff"]


def test_logits_match_transformers_at_tp1(hf_dir, tmp_path):
    assert _parity(hf_dir, tmp_path / "tp1.json", 1) < TOLERANCE


@pytest.mark.multirank
@pytest.mark.parametrize("encoder_tp", [[], ["--encoder-tp", "1"]], ids=["encoder_tp2", "encoder_tp1"])
def test_logits_match_transformers_at_tp2(hf_dir, tmp_path, encoder_tp):
    assert _parity(hf_dir, tmp_path / "tp2.json", 2, *encoder_tp) < TOLERANCE


def _loong(*args: str) -> str:
    cmd = [sys.executable, "-m", "loong_core.cli.main", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr[-6000:]}"
    return result.stdout


def _assert_same_model(a: Path, b: Path) -> None:
    import torch
    from safetensors.torch import load_file

    ta, tb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert sorted(ta) == sorted(tb) and any(k.startswith("visual.blocks.") for k in ta)
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and ta[name].view(torch.uint8).equal(tb[name].view(torch.uint8)), name
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (a, b))
    for c in (ca, cb):
        c.pop("transformers_version", None)
    assert ca == cb


def _round_trip(hf_dir: Path, tmp_path: Path, flags: list[str]) -> Path:
    _loong("convert", "hf-to-loong", "--family", "qwen2_5_vl", str(hf_dir), str(tmp_path / "ckpt"), *flags)
    _loong("convert", "loong-to-hf", str(tmp_path / "ckpt"), str(tmp_path / "out"))
    _assert_same_model(hf_dir, tmp_path / "out")
    return tmp_path / "out"


def test_bf16_round_trip_is_bit_exact_and_loads_in_transformers(hf_dir, tmp_path):
    """A bf16 source (as published) comes back in bf16: the dtype recorded at import."""
    import transformers as tf

    from loong_llm.hf.testing import bf16_copy

    out = _round_trip(bf16_copy(hf_dir, tmp_path / "bf16_src"), tmp_path, [])
    model = tf.Qwen2_5_VLForConditionalGeneration.from_pretrained(out)
    assert model.config.vision_config.fullatt_block_indexes == [1]


def test_checkpoint_saved_under_module_names_converts_to_the_published_ones(hf_dir, tmp_path):
    """A state dict saved as is (``model.visual.*``, ``model.language_model.*``) converts too."""
    import shutil

    from safetensors.torch import load_file, save_file

    renamed = tmp_path / "renamed"
    shutil.copytree(hf_dir, renamed)
    tensors = load_file(renamed / "model.safetensors")
    save_file({("model." + k if k.startswith("visual.") else k.replace("model.", "model.language_model.", 1)): v
               for k, v in tensors.items()}, renamed / "model.safetensors", metadata={"format": "pt"})
    _loong("convert", "hf-to-loong", "--family", "qwen2_5_vl", str(renamed), str(tmp_path / "ckpt"))
    _loong("convert", "loong-to-hf", str(tmp_path / "ckpt"), str(tmp_path / "out"))
    _assert_same_model(hf_dir, tmp_path / "out")


@pytest.mark.multirank
@pytest.mark.parametrize("layout", [["--tp", "2"], ["--pp", "2"]], ids=["tp2", "pp2"])
def test_round_trip_through_sharded_checkpoint_is_bit_exact(hf_dir, tmp_path, layout):
    _round_trip(hf_dir, tmp_path, layout)


def test_published_config_layout_reads_as_the_3b_model_yaml(tmp_path):
    """Released checkpoints keep the decoder's fields at the top of config.json and name the RoPE
    section ``rope_scaling: {type: mrope}``; they read as ``model=qwen2_5_vl_3b``."""
    import dataclasses

    import yaml

    from loong_core.config.validate import build_dataclass
    from loong_vlm.qwen2_5_vl.config import Qwen25VLConfig
    from loong_vlm.qwen2_5_vl.hf_adapter import Qwen25VLHFAdapter

    published = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
        "hidden_size": 2048, "intermediate_size": 11008, "num_attention_heads": 16, "num_hidden_layers": 36,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 151936,
        "max_position_embeddings": 128000, "tie_word_embeddings": True, "use_sliding_window": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "image_token_id": 151655, "video_token_id": 151656,
        "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                          "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14,
                          "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                          "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
                          "temporal_patch_size": 2}}
    (tmp_path / "config.json").write_text(json.dumps(published))
    from_hf = Qwen25VLConfig(name="qwen2_5_vl")
    Qwen25VLHFAdapter().apply_hf_config(from_hf, tmp_path)
    conf = Path(__file__).parents[1] / "src/loong_vlm/conf/model/qwen2_5_vl_3b.yaml"
    shipped = build_dataclass(Qwen25VLConfig, yaml.safe_load(conf.read_text()), "model")
    assert dataclasses.asdict(from_hf) == dataclasses.asdict(shipped)


def test_converted_checkpoint_trains_like_online_hf_loading(tmp_path):
    """2 steps of ``experiment=qwen2_5_vl_debug`` (LLaVA demo data) from ``model.init_from_hf=SRC``
    equal 2 steps from ``trainer.init_from=`` the converted checkpoint with the overrides that
    ``loong convert`` prints; the weights move."""
    src = write_hf_model(tmp_path / "src", seed=5, vocab_size=512)  # the demo tokenizer has 300 tokens
    out = _loong("convert", "hf-to-loong", "--family", "qwen2_5_vl", str(src), str(tmp_path / "ckpt"))
    line = next(x for x in out.splitlines() if x.startswith("train from it:"))
    model_overrides = [o for o in line.split()[4:] if o.startswith("model.")]
    common = ["experiment=qwen2_5_vl_debug", "trainer.train_iters=2", "trainer.log_interval=1",
              "trainer.eval_interval=0", "trainer.progress_bar=false", "trainer.tensorboard=false",
              "trainer.save_at_end=false"]
    run_train([*common, f"model.init_from_hf={src}", f"trainer.run_dir={tmp_path / 'online'}"])
    run_train([*common, *model_overrides, f"trainer.init_from={tmp_path / 'ckpt'}",
               f"trainer.run_dir={tmp_path / 'offline'}"])
    online, offline = losses(tmp_path / "online"), losses(tmp_path / "offline")
    assert sorted(online) == sorted(offline) == [1, 2]
    for step in (1, 2):
        assert offline[step] == pytest.approx(online[step], abs=1e-6)
    assert online[1] != online[2]
