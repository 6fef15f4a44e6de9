"""Per-file checksums of a checkpoint, recorded when it is written and verified before it is read.

Every file of a checkpoint directory (except the completion record itself) is listed in the
record's ``files`` entry with its size and CRC-32 (``zlib.crc32``, about 2 GB/s on one core, see
``benchmarks/checkpoint_hash.py``). On a multi-rank save each rank hashes a share of the files and
rank 0 gathers the results, so the cost per rank falls with the world size.

A checksum protects against damage (a truncated copy, a flipped bit, a file rewritten by another
tool), not against someone who can also rewrite the record: that is what
:mod:`loong_core.checkpoint.restricted` is for.
"""

from __future__ import annotations

import logging
import zlib
from pathlib import Path

from loong_core.errors import CheckpointError

logger = logging.getLogger(__name__)

_CHUNK = 16 << 20


def crc32_of(path: Path) -> str:
    """CRC-32 of a file's bytes as 8 hex digits."""
    value = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            value = zlib.crc32(chunk, value)
    return f"{value:08x}"


def checkpoint_files(directory: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """Relative paths (POSIX) of the regular files under ``directory``, sorted, minus ``skip``."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                  if p.is_file() and p.name not in skip)


def checksums(directory: Path, names: list[str]) -> dict[str, dict]:
    """``{name: {"size", "crc32"}}`` of the given files of ``directory``."""
    return {name: {"size": (directory / name).stat().st_size, "crc32": crc32_of(directory / name)}
            for name in names}


def collective_checksums(directory: Path, skip: tuple[str, ...]) -> dict[str, dict]:
    """Checksums of every file of ``directory``; each rank hashes a share, rank 0 gets all.

    Returns:
        All files' entries on rank 0, this rank's share elsewhere.
    """
    import torch

    names = checkpoint_files(directory, skip)
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return checksums(directory, names)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    mine = checksums(directory, names[rank::world])
    gathered = [None] * world if rank == 0 else None
    torch.distributed.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return mine
    return {name: entry for part in gathered for name, entry in part.items()}


def verify(path: Path, record: dict) -> None:
    """Check every file the record lists: present, of its size, with its checksum.

    A checkpoint written before checksums were recorded (no ``files`` entry) passes with a warning.

    Raises:
        CheckpointError: Naming the first missing, truncated or changed file.
    """
    files = record.get("files")
    if files is None:
        logger.warning("checkpoint %s predates per-file checksums; its files are not verified", path)
        return
    for name, want in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing: checkpoint {path} is incomplete (its record lists "
                                  f"{len(files)} files). Copy it again or use another checkpoint.")
        size = file.stat().st_size
        if size != want["size"]:
            what = "truncated" if size < want["size"] else "longer than written"
            raise CheckpointError(f"{file} is {what} ({size} bytes, {want['size']} when written): "
                                  f"checkpoint {path} is damaged. Copy it again or use another checkpoint.")
        have = crc32_of(file)
        if have != want["crc32"]:
            raise CheckpointError(f"{file} was changed after it was written (checksum {have}, "
                                  f"recorded {want['crc32']}): checkpoint {path} is damaged or was "
                                  "edited. Copy it again or use another checkpoint.")
