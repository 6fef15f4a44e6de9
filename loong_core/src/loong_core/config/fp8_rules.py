"""Config rules of FP8 training (``parallel.fp8_format`` and friends; light: no torch import)."""

from __future__ import annotations

import importlib.util
from typing import Any

from loong_core.errors import ConfigError


def transformer_engine_installed() -> bool:
    """Whether NVIDIA TransformerEngine can be imported (FP8 on the megatron engine needs it)."""
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


def check_fp8(cfg: Any) -> None:
    """FP8 runs on the torch engine through torchao; the megatron engine needs TransformerEngine.

    Raises:
        ConfigError: naming the key and the fix: FP8 on the megatron engine (always: without
            TransformerEngine there is no FP8 GEMM; with it, loong's megatron layer spec builds
            megatron-core's local layers, which have no FP8 path), or a format the recipe does not
            have (``rowwise`` scales every tensor in e4m3).
    """
    p = cfg.parallel
    if p.fp8_format is None:
        return
    if p.engine == "megatron":
        if not transformer_engine_installed():
            raise ConfigError(
                f"'parallel.fp8_format' = {p.fp8_format}: FP8 on the megatron engine needs NVIDIA "
                "TransformerEngine (its FP8 GEMMs), which is not installed. Fix: set "
                "parallel.fp8_format=null, or train on the torch engine (parallel.engine=torch, "
                "torchao float8) where the model supports it.")
        raise ConfigError(
            f"'parallel.fp8_format' = {p.fp8_format}: TransformerEngine is installed, but loong's "
            "megatron layer spec builds megatron-core's local (non-TransformerEngine) layers, which "
            "have no FP8 path. Fix: set parallel.fp8_format=null, or train on the torch engine "
            "(parallel.engine=torch, torchao float8) where the model supports it.")
    if p.fp8_recipe == "rowwise" and p.fp8_format != "e4m3":
        raise ConfigError(
            f"'parallel.fp8_format' = {p.fp8_format} with parallel.fp8_recipe=rowwise: torchao's "
            "rowwise recipe scales every tensor, gradients included, in e4m3. Fix: "
            "parallel.fp8_format=e4m3, or parallel.fp8_recipe=tensorwise for hybrid (e5m2 gradients).")
