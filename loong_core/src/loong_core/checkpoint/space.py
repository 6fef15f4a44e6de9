"""Storage faults of a checkpoint save: free space before writing, and what went wrong after.

A save that the storage cannot take (``ENOSPC``: the disk is full; ``EDQUOT``: a quota is used
up; ``EIO``, ``EROFS``, ...) must fail on every rank together and leave nothing visible
(:func:`~loong_core.checkpoint.store.save_collective`, which calls :func:`agree` after each of
its phases). Besides :func:`agree`:

- :func:`preflight` runs on rank 0 before anything is written: when the filesystem has less
  free space than the newest checkpoint took (or than :data:`MIN_FREE_BYTES` before the first
  one), the save is refused with ``ENOSPC`` at once, instead of failing halfway through the
  engine's files. This also covers the case the engines' own error handling does not: megatron-core
  writes ``common.pt`` and its metadata from rank 0 alone, between collectives, so a failure
  there would leave the other ranks waiting.
- :func:`storage_error` finds the ``OSError`` inside what an engine raised (torch's
  ``CheckpointException`` carries the per-rank exceptions of a failed write), and
  :func:`full_disk_error` recognises a full disk behind a failure that lost its ``OSError``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import torch

from loong_core.errors import CheckpointError, CheckpointSaveError

_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\] ([^:\n]+)(?:: '([^'\n]*)')?")

#: A failed write with less than this free under the checkpoint folder ran out of space.
FULL_BELOW_BYTES = 1024 * 1024

#: Free bytes required before the first checkpoint of a run directory (no size to compare with).
MIN_FREE_BYTES = 64 * 1024


def human_bytes(count: float) -> str:
    """``1.4 MiB``-style size."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def free_bytes(path: Path) -> int | None:
    """Bytes available to this user on the filesystem of ``path`` (or of its nearest existing
    parent); None when it cannot be read."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def checkpoint_size(path: Path) -> int:
    """Bytes of a complete checkpoint, from the sizes in its completion record (its files
    on disk when the record lists none)."""
    from loong_core.checkpoint.store import COMPLETE_FILE

    try:
        files = json.loads((Path(path) / COMPLETE_FILE).read_text()).get("files") or {}
        if files:
            return sum(int(entry["size"]) for entry in files.values())
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def preflight(checkpoint_root: Path, newest: Path | None) -> None:
    """Refuse a save that cannot fit: raise ``OSError(ENOSPC)`` when the free space under
    ``checkpoint_root`` is below the size of ``newest`` (the newest complete checkpoint), or
    below :data:`MIN_FREE_BYTES` when there is none. Sizes that cannot be read pass."""
    free = free_bytes(checkpoint_root)
    if free is None:
        return
    need = checkpoint_size(newest) if newest is not None else MIN_FREE_BYTES
    if free < need:
        took = f"the newest checkpoint ({newest.name}) took" if newest is not None else "a checkpoint needs at least"
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {human_bytes(free)} free in "
                      f"{checkpoint_root}, {took} {human_bytes(need)}; checked before writing")


def _chained(exc: BaseException):
    """``exc`` and the exceptions it carries: cause, context, and torch's per-rank failures."""
    seen, todo = set(), [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        failures = getattr(current, "failures", None)  # torch.distributed.checkpoint's exception
        if isinstance(failures, dict):
            for failure in failures.values():
                todo.append(failure[0] if isinstance(failure, tuple) and failure else failure)
        todo += [current.__cause__, current.__context__]


def storage_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc`` (itself, a cause, or a rank's failure inside torch's
    ``CheckpointException``), or None when the failure has another reason.

    Exceptions that crossed processes (megatron-core's writer workers, the gather of every
    rank's results to the coordinator) lose their cause when pickled and keep only its text,
    so an ``[Errno N] ...`` in the text is taken as that ``OSError``.
    """
    chain = list(_chained(exc))
    found = next((e for e in chain if isinstance(e, OSError)), None)
    if found is not None:
        return found
    for current in chain:
        match = _ERRNO_TEXT.search(str(current))
        if match:
            return OSError(int(match.group(1)), match.group(2).strip(), match.group(3))
    return None


def full_disk_error(exc: BaseException, checkpoint_root: Path) -> OSError | None:
    """``ENOSPC`` for a failure that names no ``OSError`` while the filesystem is full.

    torch's zip writer turns a short write into ``unexpected pos N vs M`` and drops the
    ``OSError``, so a failure of another kind with less than :data:`FULL_BELOW_BYTES` free
    under ``checkpoint_root`` (measured before the partial files are removed) is the full disk.
    """
    free = free_bytes(checkpoint_root)
    if free is None or free >= FULL_BELOW_BYTES:
        return None
    inner = [e for e in _chained(exc) if type(e).__name__ != "CheckpointException"] or [exc]
    said = (str(inner[0]).splitlines() or [""])[0][:200]
    return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {human_bytes(free)} free in {checkpoint_root} "
                   f"after the write failed ({type(inner[0]).__name__}: {said})")


def reported_elsewhere(exc: BaseException) -> bool:
    """``exc`` only says that the save failed on another rank: torch's / megatron-core's
    ``CheckpointException`` without failures of its own (the details are on the coordinator)."""
    failures = getattr(exc, "failures", None)
    return type(exc).__name__ == "CheckpointException" and isinstance(failures, dict) and not failures


def describe(error: OSError) -> str:
    """``[Errno 28] No space left on device: 'PATH'``-style text of a storage error."""
    if error.errno is None:
        return str(error)
    text = f"[Errno {error.errno}] {error.strerror or os.strerror(error.errno)}"
    return text + (f": {error.filename!r}" if error.filename else "")


def failure_of(exc: BaseException, rank: int, checkpoint_root: Path) -> dict:
    """What one rank reports about its failed part of a save (picklable)."""
    peer = reported_elsewhere(exc)
    error = storage_error(exc) or (None if peer else full_disk_error(exc, checkpoint_root))
    kind = "storage" if error is not None else "peer" if peer else "other"
    text = describe(error) if error is not None else f"{type(exc).__name__}: {exc}"
    return {"rank": rank, "kind": kind, "text": text}


def agree(failure: BaseException | None, rank: int, checkpoint_root: Path, partial: Path,
          iteration: int) -> None:
    """Every rank learns whether any rank failed its part of the save (one collective, in place of
    a barrier); on a failure the partial folder is removed and every rank raises.

    Raises:
        CheckpointSaveError: The storage refused a write (full disk, quota, I/O error); the
            checkpoints written before are intact.
        CheckpointError: Another rank failed for another reason (that rank re-raises its own).
    """
    mine = None if failure is None else failure_of(failure, rank, checkpoint_root)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        everyone = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    failed = [f for f in everyone if f is not None]
    if not failed:
        return
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
    if mine is not None and mine["kind"] == "other":
        raise failure
    causes = [f for f in failed if f["kind"] != "peer"] or failed
    named = "; ".join(f"rank {f['rank']}: {f['text']}" for f in causes)
    if any(f["kind"] == "other" for f in causes):
        raise CheckpointError(f"checkpoint of step {iteration} not saved ({named})")
    from loong_core.checkpoint.store import find_latest

    kept = find_latest(checkpoint_root)
    free = free_bytes(checkpoint_root)
    raise CheckpointSaveError(
        f"checkpoint of step {iteration} not saved ({named}). Nothing of it is left"
        + (f" ({human_bytes(free)} free in {checkpoint_root} now)" if free is not None else "")
        + (f"; the newest complete checkpoint, {kept.name}, is kept. " if kept
           else "; there is no earlier checkpoint. ")
        + f"Free space there, or continue on a larger disk with trainer.run_dir=<new folder> "
        f"trainer.resume={checkpoint_root.parent}.")
