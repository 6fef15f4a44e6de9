"""Shared fixtures: a data cache per session, a one-rank megatron-core group, a tiny VLM."""

from __future__ import annotations

import os

import pytest

from loong_core.testing import keep_cpu_precision_fp32, megatron_single_rank, session_cache

keep_cpu_precision_fp32()


@pytest.fixture(scope="session", autouse=True)
def loong_cache(tmp_path_factory):
    """Prepared data is cached once per session (subprocesses inherit the variable)."""
    path = session_cache(tmp_path_factory)  # shared with the other packages' tests
    old = os.environ.get("LOONG_CACHE")
    os.environ["LOONG_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("LOONG_CACHE", None)
    else:
        os.environ["LOONG_CACHE"] = old


@pytest.fixture(scope="module")
def mcore_single_rank():
    """One-rank gloo group + megatron parallel state, with the cpu backend's patches."""
    with megatron_single_rank():
        yield


def _tiny_vlm_config(foundation: str = "llama", **encoder):
    """A validated-shape VLM config: 16x16 grey images, 4x4 patches, a 2-layer foundation."""
    from loong_vlm.config import MLPProjectorConfig, ViTConfig, VLMConfig

    if foundation == "llama":
        from loong_llm.families.llama.config import LlamaConfig as Foundation
    else:
        from loong_llm.families.qwen3.config import Qwen3Config as Foundation
    return VLMConfig(
        name="vlm",
        encoder=ViTConfig(name="vit", image_size=16, num_channels=1, patch_size=4, num_layers=1,
                          hidden_size=32, num_attention_heads=2, ffn_hidden_size=64, **encoder),
        projector=MLPProjectorConfig(name="mlp_projector"),
        foundation=Foundation(name=foundation, num_layers=2, hidden_size=64, num_attention_heads=4,
                              num_query_groups=2, ffn_hidden_size=128, vocab_size=96,
                              max_position_embeddings=128),
        image_token_id=5,
    )


@pytest.fixture(scope="session")
def tiny_vlm_config():
    """Factory of a tiny :class:`~loong_vlm.config.VLMConfig` (keyword args go to the encoder)."""
    return _tiny_vlm_config


# Seconds-long runs of the debug VLM that log every step.
TINY_OVERRIDES = [
    "experiment=vlm_debug",
    "trainer.log_interval=1",
    "trainer.progress_bar=false",
    "trainer.tensorboard=false",
]


@pytest.fixture(scope="session")
def tiny():
    """Overrides of a seconds-long VLM run that logs every step."""
    return list(TINY_OVERRIDES)
