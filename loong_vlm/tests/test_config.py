"""A VLM config names its components; each is validated against its registered config class."""

from __future__ import annotations

import pytest

from loong_core.config.compose import load_config
from loong_core.errors import ConfigError


def test_nested_components_get_their_registered_config_classes():
    cfg = load_config(["experiment=vlm_debug"])
    assert type(cfg.model).__name__ == "VLMConfig"
    assert type(cfg.model.encoder).__name__ == "ViTConfig"
    assert type(cfg.model.projector).__name__ == "MLPProjectorConfig"
    assert type(cfg.model.foundation).__name__ == "LlamaConfig"
    assert cfg.data.balancer == "kk_swap"


def test_foundation_swaps_with_one_override():
    cfg = load_config(["experiment=vlm_debug", "model@model.foundation=qwen3_debug"])
    assert type(cfg.model.foundation).__name__ == "Qwen3Config"
    assert cfg.model.foundation.qk_layernorm is True and cfg.model.foundation.kv_channels == 32
    by_name = load_config(["experiment=vlm_debug", "model.foundation.name=qwen3"])
    assert type(by_name.model.foundation).__name__ == "Qwen3Config"


def test_unknown_key_in_a_component_names_its_path():
    with pytest.raises(ConfigError, match=r"Unknown key 'model.encoder.hiden_size'.*Did you mean 'hidden_size'"):
        load_config(["experiment=vlm_debug", "model.encoder.hiden_size=32"])


def test_unknown_component_name_lists_choices():
    with pytest.raises(ConfigError, match=r"Unknown model 'lama' \(at 'model.foundation.name'\).*Did you mean 'llama'"):
        load_config(["experiment=vlm_debug", "model.foundation.name=lama"])


def test_a_foundation_is_not_accepted_as_encoder(tiny_vlm_config):
    from loong_llm.families.llama.config import LlamaConfig
    from loong_vlm.provider import VLMProvider

    config = tiny_vlm_config()
    config.encoder = LlamaConfig(name="llama")
    with pytest.raises(ConfigError,
                       match=r"'model.encoder.name' = 'llama' is not a encoder; installed encoders: .*\bvit\b"):
        VLMProvider(config)
