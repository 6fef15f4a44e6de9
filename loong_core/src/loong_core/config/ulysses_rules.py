"""Config rules of ``parallel.ulysses_size`` (light: no torch import)."""

from __future__ import annotations

from typing import Any

from loong_core.errors import ConfigError


def check_ulysses(cfg: Any) -> None:
    """Ulysses sequence parallelism needs the torch engine and a model that supports it, whose
    attention head count ``parallel.ulysses_size`` divides.

    A model config declares support by returning its head count from ``ulysses_heads()``.

    Raises:
        ConfigError: naming the key, the model, its heads and the valid sizes.
    """
    n = cfg.parallel.ulysses_size
    if n == 1:
        return
    model = cfg.model.name
    if cfg.parallel.engine != "torch":
        raise ConfigError(
            f"'parallel.ulysses_size' = {n} is Ulysses sequence parallelism of the torch engine; "
            f"parallel.engine={cfg.parallel.engine} shards sequences with "
            "parallel.context_parallel_size instead (parallel.sequence_parallel is Megatron's "
            "TP activation sharding, a different thing).")
    heads_of = getattr(cfg.model, "ulysses_heads", None)
    heads = heads_of() if callable(heads_of) else None
    if heads is None:
        raise ConfigError(
            f"model '{model}' does not support parallel.ulysses_size > 1 (supported: the DiT "
            "families of loong-diffusion: dit, wan, qwen_image); set parallel.ulysses_size=1.")
    if heads % n:
        valid = [k for k in range(1, heads + 1) if heads % k == 0]
        raise ConfigError(
            f"'parallel.ulysses_size' = {n} must divide the attention heads of model '{model}' "
            f"({heads} heads; each rank attends with heads / ulysses_size of them); valid "
            f"ulysses_size: {', '.join(map(str, valid))}.")


def check_ulysses_world(parallel: Any, world_size: int) -> int:
    """The data-parallel size ``world_size / ulysses_size``, or a ConfigError when it does not divide."""
    n = parallel.ulysses_size
    if world_size % n:
        valid = [k for k in range(1, world_size + 1) if world_size % k == 0]
        raise ConfigError(
            f"world size {world_size} is not divisible by parallel.ulysses_size={n}; change "
            f"--nproc-per-node to a multiple of {n} or use ulysses_size in {valid}.")
    return world_size // n
