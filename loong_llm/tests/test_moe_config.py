"""MoE config rules, checked when the config is loaded (before any process starts)."""

from __future__ import annotations

import pytest

from loong_core.config.compose import load_config
from loong_core.errors import ConfigError

MOE_TP2 = ["experiment=qwen3_moe_debug", "parallel.tensor_model_parallel_size=2"]


def test_moe_under_tensor_parallelism_without_sequence_parallelism_is_a_config_error():
    # megatron-core would raise a ValueError in the first training forward of an MoE layer.
    with pytest.raises(ConfigError, match=r"'parallel.sequence_parallel' = false with "
                       r"parallel.tensor_model_parallel_size = 2: .* set parallel.sequence_parallel=true"):
        load_config([*MOE_TP2, "parallel.sequence_parallel=false"])
    assert load_config([*MOE_TP2, "parallel.sequence_parallel=true"]).parallel.sequence_parallel


def test_tensor_parallelism_without_sequence_parallelism_is_allowed_without_moe_layers():
    load_config([*MOE_TP2, "parallel.sequence_parallel=false", "model.moe_layer_freq=[0,0]"])
    load_config(["experiment=llama_debug", "parallel.tensor_model_parallel_size=2",
                 "parallel.sequence_parallel=false"])
