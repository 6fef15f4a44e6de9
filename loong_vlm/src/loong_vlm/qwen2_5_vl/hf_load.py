"""Load an HF vision-language directory into this rank's composed model chunks (any TP / PP)."""

from __future__ import annotations

import logging
import re
import time

import torch

from loong_core.errors import CheckpointError
from loong_llm.hf.io import SafetensorsReader
from loong_llm.hf.load import SKIP, _tp

logger = logging.getLogger(__name__)

_VISION = ("encoder.", "projector.")
_DECODER_LAYER = re.compile(r"^language_model\.decoder\.layers\.(\d+)\.")


def published_name(stored: str) -> str:
    """The published name of a tensor saved under transformers 5's module names
    (``model.visual.*`` -> ``visual.*``, ``model.language_model.*`` -> ``model.*``)."""
    if stored.startswith("model.visual."):
        return stored[len("model."):]
    if stored.startswith("model.language_model."):
        return "model." + stored[len("model.language_model."):]
    return stored


class PublishedNamesReader:
    """A :class:`~loong_llm.hf.io.SafetensorsReader` that serves tensors by their published names
    whichever of the two layouts the directory was saved in."""

    def __init__(self, hf_dir: str):
        self.inner = SafetensorsReader(hf_dir)
        self.stored = {published_name(name): name for name in self.inner.keys()}

    @property
    def bytes_read(self) -> int:
        return self.inner.bytes_read

    def keys(self) -> list[str]:
        return sorted(self.stored)

    def get(self, name: str):
        return self.inner.get(self.stored.get(name, name))


def global_vlm_names(chunk) -> dict[str, str]:
    """Local state-dict name -> global name (the foundation's layer indices made global under PP)."""
    layers = getattr(chunk.language_model.decoder, "layers", [])
    offsets = {i: layer.layer_number - 1 for i, layer in enumerate(layers)}
    names = {}
    for name, value in chunk.state_dict(keep_vars=True).items():
        if torch.is_tensor(value) and not name.endswith(SKIP):
            names[name] = _DECODER_LAYER.sub(
                lambda m: f"language_model.decoder.layers.{offsets[int(m.group(1))]}.", name)
    return names


@torch.no_grad()
def load_hf_into_vlm_chunks(adapter, cfg, chunks: list, hf_dir: str) -> None:
    """Copy the HF weights of ``hf_dir`` into every parameter of ``chunks`` (each must be covered
    by the adapter's rules), reading one HF tensor at a time."""
    started = time.perf_counter()
    reader = PublishedNamesReader(hf_dir)
    rules = adapter.rule_set(cfg)
    count = 0
    for chunk in chunks:
        params = chunk.state_dict(keep_vars=True)
        for local, name in global_vlm_names(chunk).items():
            target = params[local]
            try:
                rule, hf_names = rules.match(name)
            except KeyError:
                raise CheckpointError(f"no HF mapping for parameter {name!r} of the '{adapter.family}' "
                                      f"model (a config option its adapter does not cover).") from None
            partition_dim, rank, size = _tp(name, target)
            rows = target.shape[0] * size if rule.kind == "vocab" else None
            full = rules.to_loong(rule, [reader.get(n) for n in hf_names], rows=rows)
            if partition_dim is not None and name.startswith(_VISION):
                # the encoder's own TP size may divide the foundation's (blocks of consecutive ranks)
                size = full.shape[partition_dim] // target.shape[partition_dim]
                rank = rank % size
            part = rules.shard(rule, full, partition_dim, rank, size)
            if part.shape != target.shape:
                raise CheckpointError(f"{name}: HF tensors {hf_names} give shape {tuple(part.shape)} on "
                                      f"this rank, the model has {tuple(target.shape)}; the config does "
                                      f"not match {hf_dir}/config.json.")
            target.data.copy_(part.to(target.dtype))
            count += 1
    logger.info("loaded %d tensors (%.1f MB read) from %s in %.1fs", count, reader.bytes_read / 1e6,
                hf_dir, time.perf_counter() - started)
