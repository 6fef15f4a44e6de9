"""Load the next global batch while the current one trains (``data.prefetch``).

The loader's batches are a pure function of the iteration (see :mod:`loong_core.data.loader`),
so loading iteration ``i + 1`` ahead of time changes nothing but when the work happens: decoding
video frames, reading images or balancing a batch overlaps the training step of iteration ``i``
(the step's kernels release the GIL). The background thread runs only inside
:meth:`PrefetchingLoader.overlap`, which the training loop wraps around ``engine.train_step``
alone: it has finished before validation, checkpointing or any hook touches the datasets, so
datasets need not be thread-safe against those. An error raised while loading ahead (a corrupt
sample) is raised again when the loop asks for that iteration, exactly as without prefetching.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager


class PrefetchingLoader:
    """Wraps a :class:`~loong_core.data.loader.GlobalBatchLoader`; same ``micro_batches`` results.

    Args:
        loader: The loader to read ahead from.

    Attributes:
        last_balance_stats: The balance statistics of the batch :meth:`micro_batches` returned
            last (not of the one loaded ahead).
    """

    def __init__(self, loader):
        self.loader = loader
        self.last_balance_stats = None
        self._ready: tuple[int, list | None, object, BaseException | None] | None = None

    def micro_batches(self, iteration: int) -> list[dict]:
        """This rank's micro batches of ``iteration``: the ones loaded ahead when they are for
        this iteration, else loaded now."""
        ready, self._ready = self._ready, None
        if ready is not None and ready[0] == iteration:
            _, batches, stats, error = ready
            if error is not None:
                raise error
        else:
            batches = self.loader.micro_batches(iteration)
            stats = getattr(self.loader, "last_balance_stats", None)
        self.last_balance_stats = stats
        return batches

    @contextmanager
    def overlap(self, iteration: int | None):
        """Load ``iteration`` in a background thread while the ``with`` body runs; the thread has
        ended when the body does. ``None``: nothing to load (the last step)."""
        if iteration is None:
            yield
            return
        thread = threading.Thread(target=self._load, args=(iteration,), name="loong-prefetch", daemon=True)
        thread.start()
        try:
            yield
        finally:
            thread.join()

    def _load(self, iteration: int) -> None:
        try:
            batches = self.loader.micro_batches(iteration)
            self._ready = (iteration, batches, getattr(self.loader, "last_balance_stats", None), None)
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, raised at its iteration
            self._ready = (iteration, None, None, exc)
