"""Our families compute the same function as transformers' reference: logits of a tiny random
model loaded through ``model.init_from_hf`` match within 1e-5 relative to the largest logit (fp32)
at TP1, TP2, PP2 and EP2; with multi-token prediction layers stored (DeepSeek-V3 / V3.2, GLM-4.5), so do
each depth's logits, computed from transformers' modules (TP1, TP2, EP2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loong_llm.hf.convert import free_port
from loong_llm.hf.testing import add_mtp_layers, set_parity_seq_length, write_hf_model

FAMILIES = ["llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "deepseek_v32", "glm4_moe", "minimax_m2",
            "deepseek_v2", "qwen3_next", "qwen3_5", "qwen3_5_moe"]
MOE = ["qwen3_moe", "deepseek_v3", "deepseek_v32", "glm4_moe", "minimax_m2", "deepseek_v2", "qwen3_next",
       "qwen3_5_moe"]
LAYOUTS = {"tp1": (1, []), "tp2": (2, ["--tp", "2"]), "pp2": (2, ["--pp", "2"]),
           "ep2": (2, ["--ep", "2"])}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 16}
LONG = 64  # tokens of the YaRN cases: 4x the original context
# variant dir -> (family, config overrides, sequence length): extra dirs of the tp1 job only
VARIANTS = {
    # MLA YaRN at 64 tokens, 4x its original context; mscale != mscale_all_dim: an attention
    # factor != 1 on cos/sin and the softmax scale times mscale(factor, mscale_all_dim)^2
    "deepseek_v3+yarn": ("deepseek_v3", {"rope_parameters": {
        **YARN, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8},
        "max_position_embeddings": LONG}, LONG),
    # GQA YaRN (Qwen3 long-context style: attention factor 0.1 ln(factor) + 1 on q and k)
    "qwen3+yarn": ("qwen3", {"rope_parameters": YARN, "max_position_embeddings": LONG}, LONG),
    # DeepSeek-V3.2 as published: YaRN (the indexer's RoPE too, with its attention factor on
    # cos/sin) at 4x the original context, top-6 of 64 keys
    "deepseek_v32+yarn": ("deepseek_v32", {"rope_parameters": {
        **YARN, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8},
        "max_position_embeddings": LONG}, LONG),
    # DeepSeek-V2-Lite style: no q_lora_rank, megatron-core MLA's full query projection
    "deepseek_v2+lite": ("deepseek_v2", {"q_lora_rank": None}, 16),
}
# MTP dir -> (family, depth): the tp1, tp2 and ep2 jobs (megatron-core's MTP needs no PP here)
MTP = {"deepseek_v3+mtp": ("deepseek_v3", 1), "deepseek_v32+mtp": ("deepseek_v32", 1),
       "glm4_moe+mtp": ("glm4_moe", 2)}
TOLERANCE = 1e-5  # relative: max |loong - transformers| / max |transformers|


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """One tiny random HF model per family, in a directory named after it."""
    root = tmp_path_factory.mktemp("hf")
    dirs = {family: write_hf_model(family, root / family, seed=i) for i, family in enumerate(FAMILIES)}
    for name, (family, overrides, seq) in VARIANTS.items():
        dirs[name] = set_parity_seq_length(write_hf_model(family, root / name, seed=7, **overrides), seq)
    for name, (family, depth) in MTP.items():
        dirs[name] = add_mtp_layers(write_hf_model(family, root / name, seed=8), depth)
    return dirs


@pytest.fixture(scope="module")
def parity(hf_dirs, tmp_path_factory):
    """``layout -> {family: max abs diff}``, one torchrun job per layout (run on first use)."""
    cache: dict[str, dict] = {}

    def run(layout: str) -> dict:
        if layout not in cache:
            nproc, flags = LAYOUTS[layout]
            families = MOE if layout == "ep2" else FAMILIES
            if layout == "tp1":
                families = [*families, *VARIANTS]
            if layout != "pp2":
                families = [*families, *MTP]
            out = tmp_path_factory.mktemp("parity") / f"{layout}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                   "--master-port", str(free_port()), "-m", "loong_llm.hf.testing", str(out),
                   *flags, *(str(hf_dirs[f]) for f in families)]
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                                    env={**os.environ, "OMP_NUM_THREADS": "1"})
            assert result.returncode == 0, result.stderr[-6000:]
            cache[layout] = json.loads(out.read_text())
        return cache[layout]

    return run


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_at_tp1(parity, family):
    assert parity("tp1")[family] < TOLERANCE


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_logits_match_transformers_at_tp1(parity, variant):
    assert parity("tp1")[variant] < TOLERANCE


@pytest.mark.multirank
@pytest.mark.parametrize("layout", ["tp2", "pp2"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_when_sharded(parity, family, layout):
    assert parity(layout)[family] < TOLERANCE


@pytest.mark.multirank
@pytest.mark.parametrize("family", MOE)
def test_moe_logits_match_transformers_at_ep2(parity, family):
    assert parity("ep2")[family] < TOLERANCE


@pytest.mark.parametrize("layout", ["tp1", pytest.param("tp2", marks=pytest.mark.multirank),
                                    pytest.param("ep2", marks=pytest.mark.multirank)])
@pytest.mark.parametrize("name", list(MTP))
def test_mtp_logits_match_transformers(parity, name, layout):
    assert parity(layout)[name] < TOLERANCE
