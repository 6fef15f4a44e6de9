"""Load an HF directory into this rank's megatron-core model chunks (any TP / PP / EP layout)."""

from __future__ import annotations

import logging
import re
import time

import torch

from loong_core.errors import CheckpointError
from loong_llm.hf.io import Progress, SafetensorsReader

logger = logging.getLogger(__name__)

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.local_experts\.(\d+)\.")
SKIP = ("_extra_state", "local_tokens_per_expert")


def global_names(chunk) -> dict[str, str]:
    """Local state-dict name -> global loong name (layer and expert indices made global)."""
    from megatron.core import parallel_state as ps

    layers = getattr(getattr(chunk, "decoder", None), "layers", [])
    offsets = {i: layer.layer_number - 1 for i, layer in enumerate(layers)}
    ep_rank = ps.get_expert_model_parallel_rank()
    names = {}
    for name, value in chunk.state_dict(keep_vars=True).items():
        if not torch.is_tensor(value) or name.endswith(SKIP):
            continue
        out = _LAYER.sub(lambda m: f"decoder.layers.{offsets[int(m.group(1))]}.", name)
        m = _EXPERT.search(out)
        if m:
            layer = layers[int(_LAYER.match(name).group(1))]
            local = layer.mlp.experts.num_local_experts
            out = _EXPERT.sub(f".experts.local_experts.{ep_rank * local + int(m.group(1))}.", out)
        names[name] = out
    return names


def _tp(name: str, tensor) -> tuple[int | None, int, int]:
    """``(partition_dim, rank, size)`` of a TP-sharded tensor (experts use the expert-TP group)."""
    from megatron.core import parallel_state as ps

    if not getattr(tensor, "tensor_model_parallel", False):
        return None, 0, 1
    if ".experts." in name:
        return (tensor.partition_dim, ps.get_expert_tensor_parallel_rank(),
                ps.get_expert_tensor_parallel_world_size())
    return (tensor.partition_dim, ps.get_tensor_model_parallel_rank(),
            ps.get_tensor_model_parallel_world_size())


@torch.no_grad()
def load_hf_into_chunks(adapter, cfg, chunks: list, hf_dir: str) -> None:
    """Copy the HF weights of ``hf_dir`` into the parameters this rank holds.

    Every parameter (and persistent buffer) must be covered by the adapter's rules; every HF
    tensor is read from disk on demand, one at a time.
    """
    started = time.perf_counter()
    reader = adapter.reader(hf_dir) if hasattr(adapter, "reader") else SafetensorsReader(hf_dir)
    rules = adapter.rule_set(cfg)
    todo = []
    for chunk in chunks:
        params = chunk.state_dict(keep_vars=True)
        todo += [(glob, params[local]) for local, glob in global_names(chunk).items()]
    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    progress = Progress(len(todo), f"loading {hf_dir}", enabled=rank0)
    for glob, target in todo:
        try:
            rule, hf_names = rules.match(glob)
        except KeyError:
            raise CheckpointError(f"no HF mapping for parameter {glob!r} of the '{adapter.family}' "
                                  f"family (a config option its adapter does not cover).") from None
        partition_dim, rank, size = _tp(glob, target)
        rows = target.shape[0] * size if rule.kind == "vocab" else None
        full = rules.to_loong(rule, [reader.get(n) for n in hf_names], rows=rows)
        part = rules.shard(rule, full, partition_dim, rank, size)
        if part.shape != target.shape:
            raise CheckpointError(f"{glob}: HF tensors {hf_names} give shape {tuple(part.shape)} on "
                                  f"this rank, the model has {tuple(target.shape)}; the config does "
                                  f"not match {hf_dir}/config.json.")
        target.data.copy_(part.to(target.dtype))
        progress.update()
    progress.close()
    elapsed = time.perf_counter() - started
    logger.info("loaded %d tensors (%.1f MB read) from %s in %.1fs", len(todo),
                reader.bytes_read / 1e6, hf_dir, elapsed)
