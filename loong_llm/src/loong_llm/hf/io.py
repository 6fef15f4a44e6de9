"""Streaming safetensors I/O: read one tensor at a time, write size-bounded shards."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from loong_core.errors import CheckpointError

logger = logging.getLogger(__name__)

INDEX = "model.safetensors.index.json"


class SafetensorsReader:
    """Tensors of an HF directory by name, read one at a time with ``safe_open``.

    Args:
        hf_dir: Directory with ``model.safetensors`` or ``model.safetensors.index.json`` + shards.
    """

    def __init__(self, hf_dir: str | Path):
        from safetensors import safe_open

        self.dir = Path(hf_dir)
        index = self.dir / INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in self.dir.glob("*.safetensors"))
            weight_map = None
        if not files:
            raise CheckpointError(f"{self.dir} has no *.safetensors files.")
        self._handles = {f: safe_open(str(self.dir / f), framework="pt") for f in files}
        if weight_map is None:
            weight_map = {k: f for f, h in self._handles.items() for k in h.keys()}
        self.weight_map = weight_map
        self.bytes_read = 0

    def keys(self) -> list[str]:
        """All tensor names."""
        return sorted(self.weight_map)

    def get_size(self, name: str) -> int:
        """Bytes of tensor ``name`` (from the header; nothing is read)."""
        import math

        sl = self._handles[self.weight_map[name]].get_slice(name)
        width = {"F64": 8, "F32": 4, "I64": 8, "I32": 4, "BF16": 2, "F16": 2, "I16": 2,
                 "U8": 1, "I8": 1, "BOOL": 1}.get(sl.get_dtype(), 4)
        return math.prod(sl.get_shape()) * width

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str):
        """The tensor ``name`` (loaded now; nothing is cached)."""
        try:
            handle = self._handles[self.weight_map[name]]
        except KeyError:
            raise CheckpointError(f"tensor {name!r} is not in {self.dir} (a checkpoint of another "
                                  f"family or size?).") from None
        tensor = handle.get_tensor(name)
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def dtype(self):
        """The dtype of the first floating tensor (the checkpoint's storage dtype)."""
        for name in self.keys():
            handle = self._handles[self.weight_map[name]]
            t = handle.get_slice(name)
            if t.get_dtype() in ("BF16", "F16", "F32", "F64"):
                return {"BF16": "bfloat16", "F16": "float16", "F32": "float32",
                        "F64": "float64"}[t.get_dtype()]
        return "float32"


class ShardWriter:
    """Writes tensors into ``model-0000k-of-0000n.safetensors`` shards of at most ``max_bytes``,
    plus the index; only one shard is held in memory.

    Args:
        out_dir: Target directory (created).
        max_bytes: Shard size limit.
    """

    def __init__(self, out_dir: str | Path, max_bytes: int = 2 * 2**30):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._pending: dict = {}
        self._pending_bytes = 0
        self._shards: list[list[str]] = []
        self.bytes_written = 0

    def add(self, name: str, tensor) -> None:
        """Queue one tensor (a contiguous copy); flushes a shard when full."""
        size = tensor.numel() * tensor.element_size()
        if self._pending and self._pending_bytes + size > self.max_bytes:
            self._flush()
        self._pending[name] = tensor.contiguous().clone()
        self._pending_bytes += size

    def _flush(self) -> None:
        from safetensors.torch import save_file

        index = len(self._shards)
        save_file(self._pending, str(self.dir / f"shard-{index:05d}.tmp"), metadata={"format": "pt"})
        self._shards.append(sorted(self._pending))
        self.bytes_written += self._pending_bytes
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> None:
        """Write the last shard, name the shards and write the index (for more than one)."""
        if self._pending or not self._shards:
            self._flush()
        n = len(self._shards)
        names = (["model.safetensors"] if n == 1 else
                 [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)])
        weight_map = {}
        for k, (keys, name) in enumerate(zip(self._shards, names)):
            (self.dir / f"shard-{k:05d}.tmp").rename(self.dir / name)
            weight_map.update({key: name for key in keys})
        if n > 1:
            (self.dir / INDEX).write_text(json.dumps(
                {"metadata": {"total_size": self.bytes_written}, "weight_map": weight_map}, indent=2))


class Progress:
    """A tqdm bar on a terminal, else a log line every 10% (rank 0 only)."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.total, self.desc, self.enabled = total, desc, enabled
        self.done, self._next_log = 0, 0.1
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="tensor", leave=False)

    def update(self, n: int = 1) -> None:
        """Count ``n`` more tensors."""
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and self.total and self.done / self.total >= self._next_log:
            logger.info("%s: %d/%d tensors", self.desc, self.done, self.total)
            self._next_log += 0.1

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.close()
