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
        if m:  # the experts module of a decoder layer or of an MTP layer's transformer layer
            local = chunk.get_submodule(name[: m.start()] + ".experts").num_local_experts
            out = _EXPERT.sub(f".experts.local_experts.{ep_rank * local + int(m.group(1))}.", out)
        names[name] = out
    return names


def _local_experts(name: str, tensor) -> range | None:
    """The global experts of a stacked (grouped) expert weight on this expert-parallel rank."""
    if not name.endswith(("experts.fc1_weight", "experts.fc2_weight")):
        return None
    from megatron.core import parallel_state as ps

    local = tensor.shape[0]
    first = ps.get_expert_model_parallel_rank() * local
    return range(first, first + local)


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


class HFParts:
    """This rank's part of every parameter of ``chunks``, made from an HF directory on demand.

    The one implementation of "HF tensors -> the tensor a loong parameter holds": the adapter's
    rule (name, QKV / gate-up / vocab transforms) then this rank's TP shard. Both the in-memory
    loader (:func:`load_hf_into_chunks`) and the streaming converter
    (:mod:`loong_llm.hf.stream_checkpoint`) use it; nothing is cached.

    Args:
        adapter: The family's :class:`~loong_llm.hf.adapter.HFAdapter`.
        cfg: The model config.
        chunks: This rank's model chunks (their parameters may live on the meta device).
        hf_dir: The HF directory.
        reader: Tensor source (default: the adapter's ``reader`` or a :class:`SafetensorsReader`).
        names: ``chunk -> {local name: global name}`` (default :func:`global_names`).
    """

    def __init__(self, adapter, cfg, chunks: list, hf_dir: str, reader=None, names=None):
        if reader is None:
            reader = adapter.reader(hf_dir) if hasattr(adapter, "reader") else SafetensorsReader(hf_dir)
        self.adapter, self.hf_dir, self.reader = adapter, hf_dir, reader
        self.rules = adapter.rule_set(cfg)
        self.targets: dict[tuple[int, str], tuple[str, torch.Tensor]] = {}
        for index, chunk in enumerate(chunks):
            params = chunk.state_dict(keep_vars=True)
            for local, glob in (names or global_names)(chunk).items():
                self.targets[(index, local)] = (glob, params[local])

    def keys(self) -> list[tuple[int, str]]:
        """``(chunk index, local state-dict name)`` of every parameter covered."""
        return list(self.targets)

    def shard_args(self, glob: str, target, full) -> tuple[int | None, int, int]:
        """``(partition_dim, rank, size)`` of ``target``'s TP shard of ``full``."""
        return _tp(glob, target)

    def part(self, key: tuple[int, str]):
        """The tensor parameter ``key`` holds on this rank, in the HF file's dtype."""
        glob, target = self.targets[key]
        try:
            rule, hf_names = self.rules.match(glob, experts=_local_experts(glob, target))
        except KeyError:
            raise CheckpointError(f"no HF mapping for parameter {glob!r} of the '{self.adapter.family}' "
                                  f"family (a config option its adapter does not cover).") from None
        partition_dim, rank, size = _tp(glob, target)
        rows = target.shape[0] * size if rule.kind == "vocab" else None
        full = self.rules.to_loong(rule, [self.reader.get(n) for n in hf_names], rows=rows)
        partition_dim, rank, size = self.shard_args(glob, target, full)
        part = self.rules.shard(rule, full, partition_dim, rank, size)
        if part.shape != target.shape:
            raise CheckpointError(f"{glob}: HF tensors {hf_names} give shape {tuple(part.shape)} on "
                                  f"this rank, the model has {tuple(target.shape)}; the config does "
                                  f"not match {self.hf_dir}/config.json.")
        return part


@torch.no_grad()
def copy_parts(parts: HFParts) -> None:
    """Copy every part of ``parts`` into its parameter (cast to the parameter's dtype)."""
    started = time.perf_counter()
    keys = parts.keys()
    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    progress = Progress(len(keys), f"loading {parts.hf_dir}", enabled=rank0)
    for key in keys:
        parts.targets[key][1].data.copy_(parts.part(key))
        progress.update()
    progress.close()
    logger.info("loaded %d tensors (%.1f MB read) from %s in %.1fs", len(keys),
                parts.reader.bytes_read / 1e6, parts.hf_dir, time.perf_counter() - started)


def load_hf_into_chunks(adapter, cfg, chunks: list, hf_dir: str) -> None:
    """Copy the HF weights of ``hf_dir`` into the parameters this rank holds.

    Every parameter (and persistent buffer) must be covered by the adapter's rules; every HF
    tensor is read from disk on demand, one at a time.
    """
    copy_parts(HFParts(adapter, cfg, chunks, hf_dir))
