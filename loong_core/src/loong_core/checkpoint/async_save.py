"""Asynchronous checkpoints (``trainer.async_save``): the shards are written while training goes on.

A save starts like a synchronous one (:func:`~loong_core.checkpoint.store.begin_save`: the free-space
check and an empty ``iter_N.partial`` folder, agreed by all ranks), then the engine takes a
snapshot of its state and hands the writing to a background worker
(:meth:`~loong_core.engines.base.Engine.save_checkpoint_async`: a forked writer process on the
megatron engine, a thread with its own process group on the torch engine). Only taking the
snapshot blocks the training loop.

The commit (the checksums, the completion record, the rename; :func:`~loong_core.checkpoint.store.commit`)
happens once the write has finished on every rank, never before: :meth:`AsyncCheckpointer.poll`
asks at the start of each later step (one all-reduce of a flag while a save is in flight, none
otherwise), and :meth:`AsyncCheckpointer.wait` blocks for it before the next save and at the end
of training. Until then the checkpoint is a ``.partial`` folder that no reader takes, so a crash
(kill -9) at any moment leaves the previous checkpoints as they were. A write the storage refuses
fails like a synchronous save (:func:`~loong_core.checkpoint.space.agree`): on every rank, with
the partial folder removed and the previous checkpoint kept. Each rank checksums its shard files
in a thread once it has written them, so the commit does not read the checkpoint back.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from loong_core.checkpoint import integrity, space, store

logger = logging.getLogger(__name__)


class AsyncWrite(Protocol):
    """An engine's write in progress (what ``Engine.save_checkpoint_async`` returns)."""

    def done(self) -> bool:
        """Whether this rank's part of the write has finished (non-blocking, local)."""

    def finish(self) -> dict | None:
        """Wait for this rank's part, then complete the write (collective: the engine's metadata).

        Returns:
            Checksums of files hashed while writing (see ``store.save_collective``), or None.

        Raises:
            Exception: The write failed (on every rank).
        """

    def abort(self) -> None:
        """Stop waiting for the write (the run is failing): end background writers, commit nothing."""


class WrittenAlready:
    """An :class:`AsyncWrite` whose files were written synchronously (an engine without a
    background writer).

    Args:
        known: Checksums of files hashed while writing, if any.
    """

    def __init__(self, known: dict | None = None):
        self.known = known

    def done(self) -> bool:
        return True

    def finish(self) -> dict | None:
        return self.known

    def abort(self) -> None:
        pass


class _HashedWrite:
    """An engine's write whose shard files this rank hashes in a thread as soon as it has written
    them, so that the commit reads nothing back (the checksums are otherwise the biggest part of
    its time: the whole checkpoint at about 2 GB/s).

    Both engines write torch.distributed.checkpoint's layout, where rank ``r``'s shards are the
    files ``__r_*.distcp`` (the other files are small and hashed at the commit).
    """

    def __init__(self, write: AsyncWrite, partial: Path, rank: int):
        self.write, self.partial, self.rank = write, partial, rank
        self.known: dict = {}
        self._thread: threading.Thread | None = None

    def _hash(self) -> None:
        names = sorted(p.name for p in self.partial.glob(f"__{self.rank}_*.distcp"))
        try:
            self.known = integrity.checksums(self.partial, names)
        except OSError:
            self.known = {}  # hashed at the commit instead

    def done(self) -> bool:
        if not self.write.done():
            return False
        if self._thread is None:
            self._thread = threading.Thread(target=self._hash, name="loong-ckpt-hash", daemon=True)
            self._thread.start()
        return not self._thread.is_alive()

    def finish(self) -> dict | None:
        known = self.write.finish()
        if self._thread is not None:
            self._thread.join()
        return {**self.known, **(known or {})}

    def abort(self) -> None:
        self.write.abort()


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


@dataclasses.dataclass
class _InFlight:
    iteration: int
    write: AsyncWrite
    record: dict


class AsyncCheckpointer:
    """At most one checkpoint in flight, committed when every rank has written its part.

    Every method but :meth:`abort` is collective: all ranks call it at the same point of the loop.

    Args:
        checkpoint_root: ``<run_dir>/checkpoints``.
        device: Torch device of the default process group's collectives.
    """

    def __init__(self, checkpoint_root: Path, device: Any):
        self.checkpoint_root, self.device = Path(checkpoint_root), device
        self._pending: _InFlight | None = None
        #: Seconds the last :meth:`wait` spent waiting for the write itself (the rest: the commit).
        self.last_write_wait_s = 0.0

    @property
    def in_flight(self) -> int | None:
        """Iteration of the checkpoint being written, or None."""
        return None if self._pending is None else self._pending.iteration

    def start(self, iteration: int, write_async: Callable[[str], AsyncWrite], record: dict,
              rng_state: dict) -> None:
        """Begin a save of ``iteration``; returns once the engine's snapshot is taken.

        Args:
            iteration: Completed optimizer steps.
            write_async: ``callable(directory) -> AsyncWrite`` (collective).
            record: JSON-ready metadata for the completion record.
            rng_state: This rank's RNG state (written now, it is small).

        Raises:
            CheckpointSaveError: The storage refused the start (every rank; nothing is left).
            RuntimeError: A save is still in flight (call :meth:`wait` first).
        """
        from torch.distributed.checkpoint.api import CheckpointException

        if self._pending is not None:
            raise RuntimeError(f"checkpoint of step {self._pending.iteration} is still in flight")
        rank = _rank()
        _, partial = store.begin_save(self.checkpoint_root, iteration)
        failure, write = None, None
        try:
            write = _HashedWrite(write_async(str(partial)), partial, rank)
            store.write_rng(partial, rank, rng_state)
        except (Exception, CheckpointException) as exc:  # torch's derives from BaseException
            failure = exc
            if write is not None:
                write.abort()
        space.agree(failure, rank, self.checkpoint_root, partial, iteration)
        self._pending = _InFlight(iteration, write, record)

    def poll(self) -> Path | None:
        """Commit the checkpoint in flight if every rank has written its part (collective, cheap).

        Returns:
            The committed checkpoint, or None (nothing in flight, or still being written).

        Raises:
            CheckpointSaveError: The write failed for a reason of the storage (see :meth:`wait`).
        """
        if self._pending is None:
            return None
        flag = torch.tensor([1.0 if self._pending.write.done() else 0.0], device=self.device)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        if not bool(flag.item()):
            return None
        return self.wait()

    def wait(self) -> Path | None:
        """Block until the checkpoint in flight is written, then commit it (collective).

        Returns:
            The committed checkpoint, or None when nothing was in flight.

        Raises:
            CheckpointSaveError: The storage refused a write (on every rank): the partial folder is
                removed and the previous checkpoints are kept.
        """
        from torch.distributed.checkpoint.api import CheckpointException

        if self._pending is None:
            return None
        pending, self._pending = self._pending, None
        rank = _rank()
        failure, known = None, None
        started = time.perf_counter()
        try:
            known = pending.write.finish()
        except (Exception, CheckpointException) as exc:
            failure = exc
        self.last_write_wait_s = time.perf_counter() - started
        partial = store.partial_path(self.checkpoint_root, pending.iteration)
        space.agree(failure, rank, self.checkpoint_root, partial, pending.iteration)
        return store.commit(self.checkpoint_root, pending.iteration, pending.record,
                            known=known if isinstance(known, dict) else None)

    def abort(self) -> None:
        """Forget the checkpoint in flight without committing it (this rank only; the run is
        failing): its writers are ended and its ``.partial`` folder stays, ignored by every reader
        and removed by the next save of that step."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            try:
                pending.write.abort()
            except Exception as exc:  # noqa: BLE001 - already failing; say so and go on
                logger.warning("could not stop the writer of checkpoint %d: %s", pending.iteration, exc)
