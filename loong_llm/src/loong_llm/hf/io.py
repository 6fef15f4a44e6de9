"""Streaming safetensors I/O: read one tensor at a time, write size-bounded shards."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from loong_core.errors import CheckpointError

logger = logging.getLogger(__name__)

INDEX = "model.safetensors.index.json"


_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
_WIDTH = {"F64": 8, "F32": 4, "I64": 8, "I32": 4, "BF16": 2, "F16": 2, "I16": 2, "U8": 1, "I8": 1,
          "BOOL": 1}


def read_header(path: Path) -> tuple[dict, int]:
    """``({name: {"dtype", "shape", "data_offsets"}}, data start)`` of a safetensors file."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{path} is not a safetensors file (shorter than its header).")
        length = int.from_bytes(head, "little")
        try:
            header = json.loads(f.read(length))
        except ValueError:
            raise CheckpointError(f"{path} is not a safetensors file (bad header).") from None
    header.pop("__metadata__", None)
    return header, 8 + length


class SafetensorsReader:
    """Tensors of an HF directory by name, read one at a time.

    Each tensor is a private (copy-on-write) memory map of its own byte range, unmapped when the
    tensor is freed: reading costs no copy and no fresh memory (the pages are the page cache's;
    on a VM, first-touch anonymous memory made a positioned read into a new buffer 2.5x slower
    end to end), and the process holds only the tensors it still uses, never a whole file's
    mapping. A file shorter than its header says is refused before anything is mapped.

    Args:
        hf_dir: Directory with ``model.safetensors`` or ``model.safetensors.index.json`` + shards.
    """

    def __init__(self, hf_dir: str | Path):
        self.dir = Path(hf_dir)
        index = self.dir / INDEX
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in self.dir.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.dir} has no *.safetensors files.")
        self._entries: dict[str, tuple[str, dict, int]] = {}
        for name in files:
            header, start = read_header(self.dir / name)
            for key, entry in header.items():
                self._entries[key] = (name, entry, start)
        self.weight_map = {k: v[0] for k, v in self._entries.items()}
        self._fds: dict[str, int] = {}
        self.bytes_read = 0

    def keys(self) -> list[str]:
        """All tensor names."""
        return sorted(self.weight_map)

    def get_size(self, name: str) -> int:
        """Bytes of tensor ``name`` (from the header; nothing is read)."""
        _, entry, _ = self._entries[name]
        begin, end = entry["data_offsets"]
        return end - begin

    def shape(self, name: str) -> list[int]:
        """Shape of tensor ``name`` (from the header; nothing is read)."""
        return list(self._entries[name][1]["shape"])

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str):
        """The tensor ``name`` (mapped now; nothing is cached)."""
        import mmap
        import os

        import torch

        try:
            file, entry, start = self._entries[name]
        except KeyError:
            raise CheckpointError(f"tensor {name!r} is not in {self.dir} (a checkpoint of another "
                                  f"family or size?).") from None
        kind = entry["dtype"]
        if kind not in _DTYPES:
            raise CheckpointError(f"{self.dir / file}: tensor {name!r} has dtype {kind}, which loong "
                                  f"does not read ({', '.join(_DTYPES)}).")
        begin, end = entry["data_offsets"]
        shape = entry["shape"]
        numel = 1
        for dim in shape:
            numel *= dim
        if end - begin != numel * _WIDTH[kind]:
            raise CheckpointError(f"{self.dir / file}: tensor {name!r} has {end - begin} bytes, its "
                                  f"shape {shape} and dtype {kind} need {numel * _WIDTH[kind]}.")
        fd = self._fds.get(file)
        if fd is None:
            fd = self._fds[file] = os.open(self.dir / file, os.O_RDONLY)
        dtype = getattr(torch, _DTYPES[kind])
        offset, size = start + begin, end - begin
        if os.fstat(fd).st_size < offset + size:  # a mapping past the end would fault (SIGBUS)
            raise CheckpointError(f"{self.dir / file} is truncated (tensor {name!r}).")
        if size == 0:
            return torch.empty(shape, dtype=dtype)
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, offset + size - base, offset=base, access=mmap.ACCESS_COPY)
        raw = torch.frombuffer(mapped, dtype=torch.uint8, count=size, offset=offset - base)
        self.bytes_read += size
        return raw.view(dtype).reshape(shape)

    def dtype(self):
        """The dtype of the first floating tensor (the checkpoint's storage dtype)."""
        for name in self.keys():
            kind = self._entries[name][1]["dtype"]
            if kind in ("BF16", "F16", "F32", "F64"):
                return _DTYPES[kind]
        return "float32"

    def close(self) -> None:
        """Close the files."""
        import os

        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


_CODES = {v: k for k, v in _DTYPES.items()}


class ShardWriter:
    """Streams tensors into ``model-0000k-of-0000n.safetensors`` shards of at most ``max_bytes``
    (``model.safetensors`` when one), plus the index. The shards are laid out from ``plan`` before
    anything is written, so each tensor goes to disk when added and nothing is held.

    Args:
        out_dir: Target directory (created).
        plan: ``(name, shape, dtype)`` of every tensor, in the order they will be added.
        max_bytes: Shard size limit.
    """

    def __init__(self, out_dir: str | Path, plan: list[tuple[str, tuple, object]],
                 max_bytes: int = 2 * 2**30):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._shards: list[list[tuple[str, tuple, str, int]]] = []
        size_of_shard = 0
        for name, shape, dtype in plan:
            code = _CODES[str(dtype).removeprefix("torch.")]
            numel = 1
            for dim in shape:
                numel *= dim
            size = numel * _WIDTH[code]
            if not self._shards or (self._shards[-1] and size_of_shard + size > max_bytes):
                self._shards.append([])
                size_of_shard = 0
            self._shards[-1].append((name, tuple(shape), code, size))
            size_of_shard += size
        self._order = [(k, entry) for k, shard in enumerate(self._shards) for entry in shard]
        self._next = 0
        self._file = None
        self.bytes_written = 0

    def _tmp(self, k: int) -> Path:
        return self.dir / f"shard-{k:05d}.tmp"

    def _open(self, k: int) -> None:
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, code, size in self._shards[k]:
            header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data start 8-byte aligned, as safetensors writes them
        self._file = open(self._tmp(k), "wb")
        self._file.write(len(raw).to_bytes(8, "little") + raw)

    def add(self, name: str, tensor) -> None:
        """Write the next planned tensor (it must match the plan's name, shape and dtype)."""
        import torch

        if self._next >= len(self._order):
            raise CheckpointError(f"internal: tensor {name!r} was not planned for {self.dir}.")
        k, (planned, shape, code, size) = self._order[self._next]
        if (name, tuple(tensor.shape), _DTYPES[code]) != (planned, shape,
                                                          str(tensor.dtype).removeprefix("torch.")):
            raise CheckpointError(f"internal: {self.dir} expected {planned} {shape} {_DTYPES[code]}, "
                                  f"got {name} {tuple(tensor.shape)} {tensor.dtype}.")
        if self._file is None or (self._next > 0 and self._order[self._next - 1][0] != k):
            if self._file is not None:
                self._file.close()
            self._open(k)
        if size:
            self._file.write(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
        self.bytes_written += size
        self._next += 1

    def close(self) -> None:
        """Close the last shard, name the shards and write the index (for more than one)."""
        if self._next != len(self._order):
            raise CheckpointError(f"internal: {len(self._order) - self._next} planned tensors were "
                                  f"not written to {self.dir}.")
        if not self._shards:  # nothing planned: one empty file, as before
            self._shards.append([])
        if self._file is None:
            self._open(0)
        self._file.close()
        n = len(self._shards)
        names = (["model.safetensors"] if n == 1 else
                 [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)])
        weight_map = {}
        for k, name in enumerate(names):
            self._tmp(k).rename(self.dir / name)
            weight_map.update({entry[0]: name for entry in self._shards[k]})
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
