"""Config rules of ``parallel.sequence_chunks`` (light: no torch import)."""

from __future__ import annotations

from typing import Any

from loong_core.errors import ConfigError


def chunk_multiple(parallel: Any) -> int:
    """What one chunk's length must be a multiple of: ``2 x CP`` under context parallelism (the
    load-balanced layout of each chunk), ``x TP`` with sequence parallelism."""
    multiple = 2 * parallel.context_parallel_size if parallel.context_parallel_size > 1 else 1
    if parallel.sequence_parallel:
        multiple *= parallel.tensor_model_parallel_size
    return multiple


def _nearest_multiple(value: int, multiple: int) -> int:
    lower = max(multiple, value // multiple * multiple)
    upper = lower + multiple if lower < value else lower
    return lower if value - lower <= upper - value else upper


def check_sequence_chunks(cfg: Any) -> None:
    """The chunked schedule needs the megatron engine, no pipeline parallelism, no overlapped
    gradient reduce, and a sequence that splits into equal chunks.

    Raises:
        ConfigError: naming the key, and for a length that does not split, the nearest valid
            ``data.seq_length`` and ``parallel.sequence_chunks``.
    """
    p = cfg.parallel
    k = p.sequence_chunks
    if k == 1:
        return
    if p.engine != "megatron":
        raise ConfigError(f"'parallel.sequence_chunks' = {k} is a schedule of the megatron engine; "
                          f"parallel.engine={p.engine} does not run it. Set parallel.sequence_chunks=1.")
    if p.pipeline_model_parallel_size > 1:
        raise ConfigError(
            f"'parallel.sequence_chunks' = {k} does not work with pipeline parallelism yet "
            f"(parallel.pipeline_model_parallel_size = {p.pipeline_model_parallel_size}: megatron-core's "
            "pipeline schedules move whole sequences); set one of them to 1.")
    if p.overlap_grad_reduce:
        raise ConfigError(f"'parallel.sequence_chunks' = {k} with parallel.overlap_grad_reduce=true "
                          "is not tested yet (megatron-core's DDP sees every gradient once per chunk); "
                          "set parallel.overlap_grad_reduce=false.")
    seq = cfg.data.seq_length
    multiple = chunk_multiple(p)
    if seq % (k * multiple) == 0:
        return
    valid = [n for n in range(1, seq // multiple + 1) if seq % (n * multiple) == 0]
    nearest_k = min(valid, key=lambda n: (abs(n - k), n)) if valid else 1
    why = f"parallel.sequence_chunks = {k}"
    if multiple > 1:
        why += f" x {multiple} ("
        parts = []
        if p.context_parallel_size > 1:
            parts.append(f"2 x parallel.context_parallel_size = {2 * p.context_parallel_size}")
        if p.sequence_parallel:
            parts.append(f"parallel.tensor_model_parallel_size = {p.tensor_model_parallel_size}")
        why += " x ".join(parts) + f", per chunk) = {k * multiple}"
    raise ConfigError(
        f"'data.seq_length' = {seq} must be a multiple of {why} to split into "
        f"equal chunks; the nearest valid length is {_nearest_multiple(seq, k * multiple)} "
        f"(or parallel.sequence_chunks={nearest_k} at this length).")
