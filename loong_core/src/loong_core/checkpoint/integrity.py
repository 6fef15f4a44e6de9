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
import threading
import zlib
from pathlib import Path

from loong_core.errors import CheckpointError

logger = logging.getLogger(__name__)

_CHUNK = 16 << 20


def crc32_of(path: Path) -> str:
    """CRC-32 of a file's bytes as 8 hex digits (read through one reused buffer: no new memory
    per chunk, which on a VM costs more than the checksum)."""
    value = 0
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while got := handle.readinto(buffer):
            value = zlib.crc32(view[:got], value)
    return f"{value:08x}"


_OVERLAP_BYTES = 1 << 20
_WORKER = None


def _crc_worker():
    """One thread that checksums large writes while the writer's thread writes them."""
    global _WORKER
    if _WORKER is None:
        from concurrent.futures import ThreadPoolExecutor

        _WORKER = ThreadPoolExecutor(1, thread_name_prefix="loong-crc")
    return _WORKER


class HashingStream:
    """A binary output stream that passes every write on to ``stream`` and keeps the size and
    CRC-32 of the bytes written, so a writer's checksum costs no second pass over the file.

    The checksum is the file's only when the bytes went out in order: a ``seek`` marks the result
    unusable (:attr:`entry` is then None and the file is hashed from disk instead).

    Args:
        stream: The open file (binary, write mode).
    """

    def __init__(self, stream):
        self.stream, self.size, self.crc, self.sequential = stream, 0, 0, True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if len(view) >= _OVERLAP_BYTES:  # checksum and write side by side (both release the GIL)
            pending = _crc_worker().submit(zlib.crc32, view, self.crc)
            written = self.stream.write(view)
            self.crc = pending.result()
        else:
            self.crc = zlib.crc32(view, self.crc)
            written = self.stream.write(view)
        self.size += len(view)
        return written

    def tell(self) -> int:
        return self.stream.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        self.sequential = False
        return self.stream.seek(offset, whence)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def close(self) -> None:
        self.stream.close()

    @property
    def closed(self) -> bool:
        return self.stream.closed

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def entry(self) -> dict | None:
        """``{"size", "crc32"}`` of what was written, or None after a seek."""
        return {"size": self.size, "crc32": f"{self.crc:08x}"} if self.sequential else None


def checkpoint_files(directory: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """Relative paths (POSIX) of the regular files under ``directory``, sorted, minus ``skip``."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                  if p.is_file() and p.name not in skip)


def checksums(directory: Path, names: list[str], known: dict[str, dict] | None = None) -> dict[str, dict]:
    """``{name: {"size", "crc32"}}`` of the given files of ``directory``.

    Args:
        directory: The checkpoint directory.
        names: Files to list (relative paths).
        known: Entries already computed while writing (:class:`HashingStream`); one is used only
            when the file on disk still has its size, otherwise the file is hashed.
    """
    known = known or {}
    out = {}
    for name in names:
        size = (directory / name).stat().st_size
        entry = known.get(name)
        out[name] = (dict(entry) if entry is not None and entry["size"] == size
                     else {"size": size, "crc32": crc32_of(directory / name)})
    return out


def collective_checksums(directory: Path, skip: tuple[str, ...],
                         known: dict[str, dict] | None = None) -> dict[str, dict]:
    """Checksums of every file of ``directory``; each rank hashes a share, rank 0 gets all.

    Args:
        directory: The checkpoint directory.
        skip: File names not to list.
        known: This rank's entries computed while writing (see :func:`checksums`).

    Returns:
        All files' entries on rank 0, this rank's share elsewhere.
    """
    import torch

    names = checkpoint_files(directory, skip)
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return checksums(directory, names, known)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    everyone = [None] * world
    torch.distributed.all_gather_object(everyone, dict(known or {}))
    known_all = {name: entry for part in everyone for name, entry in part.items()}
    todo = [name for name in names if name not in known_all]
    mine = checksums(directory, todo[rank::world])
    if rank == 0:  # rank 0 takes the written entries of every rank (their sizes checked)
        mine.update(checksums(directory, [n for n in names if n in known_all], known_all))
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


class BackgroundVerify:
    """:func:`verify` of a checkpoint in a thread, for a reader that consumes the checkpoint
    meanwhile and publishes nothing before :meth:`wait` returns.

    Reading a damaged file is harmless with loong's readers (every file goes through
    :mod:`loong_core.checkpoint.restricted`, which never runs code from it), so what the checksums
    guard, that no result is made from a damaged checkpoint, holds as long as the caller waits
    before making its output visible. ``zlib.crc32`` and file reads release the GIL, so the check
    overlaps the caller's work.

    Args:
        path: The checkpoint directory.
        record: Its completion record.
    """

    def __init__(self, path: Path, record: dict):
        self.path, self.error = Path(path), None
        self._thread = threading.Thread(target=self._run, args=(record,), name="loong-verify",
                                        daemon=True)
        self._thread.start()

    def _run(self, record: dict) -> None:
        try:
            verify(self.path, record)
        except CheckpointError as exc:
            self.error = exc
        except OSError as exc:
            self.error = CheckpointError(f"could not read checkpoint {self.path} to verify it "
                                         f"({exc}).")

    def join(self) -> None:
        """Block until the check is done (its result is kept for :meth:`wait`)."""
        self._thread.join()

    def wait(self) -> None:
        """Block until the check is done.

        Raises:
            CheckpointError: The check failed (the message names the file).
        """
        self._thread.join()
        if self.error is not None:
            raise self.error
