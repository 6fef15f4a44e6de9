"""MiniMax-M2 specifics: the published shape reads as ``minimax_m2_230b_a10b`` and writes back,
and the whole-projection q/k norm computes transformers' ``MiniMaxM2RMSNorm`` (one rank; the
TP-sharded reduction is covered by the TP2 parity and training tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import loong_llm
from loong_llm.families.minimax_m2.config import MiniMaxM2Config
from loong_llm.families.minimax_m2.hf_adapter import MiniMaxM2HFAdapter

CONF = Path(loong_llm.__file__).parent / "conf" / "model"


def published_hf_config() -> dict:
    """transformers' MiniMax-M2 defaults are the published model's shape; it rotates 64 channels."""
    import transformers as tf

    return tf.MiniMaxM2Config(rotary_dim=64).to_dict()


def test_published_config_reads_as_the_230b_yaml_and_writes_back():
    hf = published_hf_config()
    fields = MiniMaxM2HFAdapter().config_from_hf(hf)
    expected = yaml.safe_load((CONF / "minimax_m2_230b_a10b.yaml").read_text())
    expected.pop("name")
    assert {k: fields[k] for k in expected} == expected
    cfg = MiniMaxM2Config(name="minimax_m2", **fields)
    assert cfg.rotary_dim() == 64
    out = MiniMaxM2HFAdapter().config_to_hf(cfg)
    for key in ("head_dim", "rotary_dim", "intermediate_size", "num_local_experts",
                "num_experts_per_tok", "num_key_value_heads", "rope_parameters", "vocab_size"):
        assert out[key] == hf[key], key


def test_other_routing_is_refused():
    from loong_core.errors import ConfigError

    with pytest.raises(ConfigError, match="scoring_func"):
        MiniMaxM2HFAdapter().config_from_hf({**published_hf_config(), "scoring_func": "softmax"})


@pytest.mark.parametrize("projection,heads", [("query", 4), ("key", 2)])
def test_projection_norm_is_one_rms_norm_over_all_heads(projection, heads):
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2RMSNorm

    from loong_llm.families.minimax_m2.projection_norm import ProjectionRMSNorm

    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4,
                               num_query_groups=2, kv_channels=8, use_cpu_initialization=True)
    ours = ProjectionRMSNorm(config, hidden_size=8, eps=1e-6, projection=projection)
    ref = MiniMaxM2RMSNorm(heads * 8, eps=1e-6)
    torch.manual_seed(0)
    with torch.no_grad():
        ref.weight.copy_(1.0 + 0.1 * torch.randn(heads * 8))
        ours.weight.copy_(ref.weight)
    x = torch.randn(5, 3, heads, 8)
    torch.testing.assert_close(ours(x), ref(x.reshape(5, 3, -1)).reshape(5, 3, heads, 8))
    assert ours.weight.tensor_model_parallel and ours.weight.partition_dim == 0
