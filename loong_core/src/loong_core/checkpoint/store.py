"""Checkpoint directories that become visible only when complete.

Layout under ``<run_dir>/checkpoints``::

    iter_0000010/             a complete checkpoint (renamed into place as the last step)
        loong_complete.json   iteration, world size, layout, size and CRC-32 of every other file;
                              written before the rename
        rng/rank_00000.pt     per-rank RNG state
        ...                   the engine's files (dist_checkpointing / DCP)
    iter_0000020.partial/     a save in progress or interrupted: never loaded, removed on retry

Saving is collective: every rank writes its shards into ``iter_N.partial``; once all have, rank 0
writes the completion record and renames the folder. A crash at any point leaves either the old
checkpoints untouched or a ``.partial`` folder that :func:`find_latest` ignores. A save the storage
refuses (a full disk) fails on every rank together and removes its ``.partial`` folder
(:mod:`~loong_core.checkpoint.space`). Before a
checkpoint is read, :func:`verify_checkpoint` checks its files against the record
(:mod:`~loong_core.checkpoint.integrity`), and :func:`find_latest_intact` passes over damaged ones.

The phases (:func:`begin_save`, the engine's write and :func:`write_rng`, :func:`commit`) are
also used apart: an asynchronous save (:mod:`~loong_core.checkpoint.async_save`) commits when the
engine's background write has finished on every rank, steps later.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

import torch

from loong_core.checkpoint import integrity, space
from loong_core.errors import CheckpointError

logger = logging.getLogger(__name__)

COMPLETE_FILE = "loong_complete.json"
_NAME = re.compile(r"^iter_(\d{7})$")


def checkpoint_name(iteration: int) -> str:
    """Directory name of the checkpoint taken after ``iteration`` steps."""
    return f"iter_{iteration:07d}"


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a finished checkpoint directory."""
    return bool(_NAME.match(path.name)) and (path / COMPLETE_FILE).is_file()


def list_checkpoints(checkpoint_root: Path) -> list[Path]:
    """Complete checkpoints under ``checkpoint_root``, oldest first."""
    if not checkpoint_root.is_dir():
        return []
    found = [p for p in checkpoint_root.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def find_latest(checkpoint_root: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(checkpoint_root)
    return found[-1] if found else None


def read_record(path: Path) -> dict:
    """The completion record of a checkpoint; raises :class:`CheckpointError` if absent/corrupt."""
    try:
        return json.loads((path / COMPLETE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is not a complete loong checkpoint ({COMPLETE_FILE} missing or unreadable: "
            f"{exc}). Point trainer.resume (or trainer.init_from) at a directory named iter_NNNNNNN "
            "that contains it, or at a run directory to take its newest complete checkpoint."
        ) from None


def verify_checkpoint(path: Path) -> dict:
    """The record of ``path`` after checking every file it lists (size and checksum).

    Raises:
        CheckpointError: No record, or a file is missing, truncated or changed (named).
    """
    record = read_record(path)
    integrity.verify(path, record)
    return record


def find_latest_intact(checkpoint_root: Path) -> Path | None:
    """The newest complete checkpoint whose files verify; damaged newer ones are logged and passed over.

    Raises:
        CheckpointError: There are checkpoints, but none is intact.
    """
    found = list_checkpoints(checkpoint_root)
    problems = []
    for path in reversed(found):
        try:
            verify_checkpoint(path)
        except CheckpointError as exc:
            logger.warning("trainer.resume=auto: skipping damaged checkpoint: %s", exc)
            problems.append(str(exc))
            continue
        if problems:
            logger.warning("trainer.resume=auto: falling back to %s, the newest intact checkpoint", path)
        return path
    if problems:
        raise CheckpointError(f"no intact checkpoint in {checkpoint_root}: {'; '.join(problems)}. Restore "
                              "the files, or start over with trainer.resume=none (or another trainer.run_dir).")
    return None


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint ``path`` names: a complete ``iter_N`` directory as it is, or the newest
    complete checkpoint of a run directory (``<path>/checkpoints/iter_N``).

    Raises:
        CheckpointError: Neither (the message says what was expected).
    """
    path = Path(path)
    if not (path / COMPLETE_FILE).exists():
        latest = find_latest(path / "checkpoints") if (path / "checkpoints").is_dir() else None
        if latest is not None:
            return latest
    read_record(path)
    return path


def write_record(directory: Path, record: dict) -> None:
    """Write the completion record of a checkpoint written in one process, with the size and
    checksum of every file already in ``directory`` (for writers other than
    :func:`save_collective`, such as converters)."""
    names = integrity.checkpoint_files(directory, skip=(COMPLETE_FILE,))
    tmp = directory / (COMPLETE_FILE + ".tmp")
    tmp.write_text(json.dumps({**record, "files": integrity.checksums(directory, names)}, indent=1))
    os.replace(tmp, directory / COMPLETE_FILE)


def save_collective(checkpoint_root: Path, iteration: int, write_shards, record: dict,
                    rng_state: dict) -> Path:
    """Write a checkpoint atomically on all ranks.

    A failure on any rank fails the save on every rank: the ``.partial`` folder is removed and
    the checkpoints written before stay as they were (a complete checkpoint of the same
    iteration is replaced only by a complete one). Before writing, rank 0 refuses a save that
    cannot fit (:func:`~loong_core.checkpoint.space.preflight`).

    Args:
        checkpoint_root: ``<run_dir>/checkpoints``.
        iteration: Completed optimizer steps.
        write_shards: ``callable(directory: str)`` that writes the engine's state (collective);
            it may return ``{relative path: {"size", "crc32"}}`` of files it hashed while writing
            them (:class:`~loong_core.checkpoint.integrity.HashingStream`), which are then not
            read back.
        record: JSON-ready metadata stored in the completion record.
        rng_state: This rank's RNG state.

    Returns:
        The final checkpoint directory.

    Raises:
        CheckpointSaveError: The storage refused a write (see :func:`~loong_core.checkpoint.space.agree`).
    """
    from torch.distributed.checkpoint.api import CheckpointException

    rank = _rank()
    _, partial = begin_save(checkpoint_root, iteration)
    failure = known = None
    try:
        known = write_shards(str(partial))
        write_rng(partial, rank, rng_state)
    except (Exception, CheckpointException) as exc:  # torch's derives from BaseException
        failure = exc  # every rank hears of it first; then it is raised
    space.agree(failure, rank, checkpoint_root, partial, iteration)
    return commit(checkpoint_root, iteration, record, known=known if isinstance(known, dict) else None)


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def partial_path(checkpoint_root: Path, iteration: int) -> Path:
    """The folder a save of ``iteration`` writes into until it is complete."""
    return checkpoint_root / (checkpoint_name(iteration) + ".partial")


def begin_save(checkpoint_root: Path, iteration: int) -> tuple[Path, Path]:
    """First phase of a collective save: rank 0 makes an empty ``iter_N.partial`` folder after
    the free-space check (:func:`~loong_core.checkpoint.space.preflight`); all ranks agree.

    Returns:
        ``(final, partial)`` directories.

    Raises:
        CheckpointSaveError: The storage refused (on every rank).
    """
    rank = _rank()
    final = checkpoint_root / checkpoint_name(iteration)
    partial = partial_path(checkpoint_root, iteration)
    failure = None
    if rank == 0:
        try:
            checkpoint_root.mkdir(parents=True, exist_ok=True)
            if partial.exists():
                shutil.rmtree(partial)
            space.preflight(checkpoint_root, find_latest(checkpoint_root))
            partial.mkdir(parents=True)
        except OSError as exc:
            failure = exc
    space.agree(failure, rank, checkpoint_root, partial, iteration)
    return final, partial


def write_rng(partial: Path, rank: int, rng_state: dict) -> None:
    """This rank's RNG state into the partial folder."""
    (partial / "rng").mkdir(exist_ok=True)
    torch.save(rng_state, partial / "rng" / f"rank_{rank:05d}.pt")


def commit(checkpoint_root: Path, iteration: int, record: dict, known: dict | None = None) -> Path:
    """Last phase of a collective save, once every rank's files are in ``iter_N.partial``: the
    checksums (each rank a share), then rank 0 writes the completion record and renames the
    folder into place; all ranks agree on the outcome.

    Args:
        checkpoint_root: ``<run_dir>/checkpoints``.
        iteration: Completed optimizer steps.
        record: JSON-ready metadata stored in the completion record.
        known: This rank's checksums computed while writing, if any.

    Returns:
        The final checkpoint directory.

    Raises:
        CheckpointSaveError: The storage refused a write (the partial folder is removed).
    """
    rank = _rank()
    final = checkpoint_root / checkpoint_name(iteration)
    partial = partial_path(checkpoint_root, iteration)
    failure = None
    files = integrity.collective_checksums(partial, skip=(COMPLETE_FILE, COMPLETE_FILE[:-5] + ".tmp"),
                                           known=known)
    if rank == 0:
        try:
            complete = partial / COMPLETE_FILE
            tmp = complete.with_suffix(".tmp")
            tmp.write_text(json.dumps({"iteration": iteration, **record, "files": files}, indent=1))
            os.replace(tmp, complete)
            if final.exists():  # the same iteration saved again: replaced only now it is complete
                shutil.rmtree(final)
            os.replace(partial, final)
        except OSError as exc:
            failure = exc
        else:
            _sync_directory(checkpoint_root)
    space.agree(failure, rank, checkpoint_root, partial, iteration)
    return final


def _sync_directory(path: Path) -> None:
    """Flush a rename in ``path`` to disk (a failure only means it may not survive a power cut)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        logger.warning("could not flush %s to disk (%s); the checkpoint is complete", path, exc)


def load_rng(path: Path, rank: int) -> dict | None:
    """RNG state saved by ``rank``, or None when the checkpoint has none for it."""
    file = path / "rng" / f"rank_{rank:05d}.pt"
    if not file.is_file():
        return None
    from loong_core.checkpoint.restricted import load_torch_file

    return load_torch_file(file)


def prune(checkpoint_root: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` complete checkpoints (rank 0 only; ``keep<=0``: none)."""
    if keep <= 0:
        return
    for old in list_checkpoints(checkpoint_root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
