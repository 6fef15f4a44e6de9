"""YaRN RoPE scaling against transformers: inverse frequencies and attention factor (several
``rope_parameters`` spellings), megatron-core's concentration factor with the ``mscale`` loong
gives it, and the refusals of what megatron-core cannot compute the same."""

from __future__ import annotations

import pytest

from loong_core.errors import ConfigError
from loong_llm.families.common import rope
from loong_llm.families.common.hf_adapter import rope_from_hf

BASE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 16}
PARAMS = {
    "plain": BASE,
    "deepseek": {**BASE, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    "mscale_only": {**BASE, "mscale": 0.8},
    "ratio": {**BASE, "mscale": 1.0, "mscale_all_dim": 0.8},
    "explicit": {**BASE, "attention_factor": 1.3, "beta_fast": 16, "beta_slow": 2},
    "untruncated": {**BASE, "truncate": False, "factor": 40.0, "original_max_position_embeddings": 4096},
}


@pytest.mark.parametrize("case", list(PARAMS))
def test_yarn_matches_transformers(case):
    import torch
    import transformers as tf
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        _yarn_get_concentration_factor,
    )
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(PARAMS[case])
    hf = tf.Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=32,
                        max_position_embeddings=64, rope_parameters=dict(params))
    expected, factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
    base, scaling = rope_from_hf({"rope_parameters": params})
    assert torch.equal(rope.inv_freq(32, base, scaling), expected)
    assert rope.attention_factor(scaling) == pytest.approx(factor, rel=1e-15)
    for all_dim in (0.0, float(scaling.mscale_all_dim or 0.0)):  # GQA, MLA
        got = _yarn_get_concentration_factor(scaling.factor, rope.mcore_mscale(scaling, all_dim), all_dim)
        assert got == pytest.approx(factor, rel=1e-12)


def test_deepseek_v2_refuses_group_scores_megatron_ranks_differently():
    from loong_llm.families.deepseek_v2.hf_adapter import DeepSeekV2HFAdapter

    hf = {"topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3,
          "num_experts_per_tok": 6}
    with pytest.raises(ConfigError, match="num_experts_per_tok == topk_group"):
        DeepSeekV2HFAdapter().config_from_hf(hf)
