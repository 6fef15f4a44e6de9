"""Load an HF vision-language directory into this rank's composed model chunks (any TP / PP)."""

from __future__ import annotations

import logging
import re

import torch

from loong_llm.hf.io import SafetensorsReader
from loong_llm.hf.load import SKIP, HFParts, _tp, copy_parts

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
    whichever of the two layouts the directory was saved in.

    Args:
        hf_dir: The HF directory.
        rename: Stored name -> published name (default: Qwen2.5-VL's :func:`published_name`).
    """

    def __init__(self, hf_dir: str, rename=published_name):
        self.inner = SafetensorsReader(hf_dir)
        self.stored = {rename(name): name for name in self.inner.keys()}

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


class VLMParts(HFParts):
    """:class:`~loong_llm.hf.load.HFParts` of a composed VLM: published names, the foundation's
    global layer indices, and an encoder whose TP size may divide the foundation's (blocks of
    consecutive ranks)."""

    def __init__(self, adapter, cfg, chunks: list, hf_dir: str):
        super().__init__(adapter, cfg, chunks, hf_dir, reader=PublishedNamesReader(hf_dir),
                         names=global_vlm_names)

    def shard_args(self, glob: str, target, full) -> tuple[int | None, int, int]:
        partition_dim, rank, size = _tp(glob, target)
        if partition_dim is not None and glob.startswith(_VISION):
            size = full.shape[partition_dim] // target.shape[partition_dim]
            rank = rank % size
        return partition_dim, rank, size


def load_hf_into_vlm_chunks(adapter, cfg, chunks: list, hf_dir: str) -> None:
    """Copy the HF weights of ``hf_dir`` into every parameter of ``chunks`` (each must be covered
    by the adapter's rules), reading one HF tensor at a time."""
    copy_parts(VLMParts(adapter, cfg, chunks, hf_dir))
