"""megatron-core's asynchronous save behind loong's :class:`~loong_core.checkpoint.async_save.AsyncWrite`.

``dist_checkpointing.save(..., async_sharded_save=True)`` plans the save, writes ``common.pt`` and
returns an ``AsyncRequest``; an ``AsyncCallsQueue`` (non-persistent) forks one writer process per
save, which runs megatron-core's file writer (itself forking a worker per file bucket). The fork is
the snapshot: the writer sees the tensors as they were when it started (copy-on-write), and on a
GPU the request's preload copies them to host memory first. Finalising (gathering the write
results, the ``.metadata`` and ``metadata.json`` files) is collective and runs in the training
process when every rank's writer has exited.

The writer reports its results through :class:`ResultsQueue` instead of megatron-core's default
``multiprocessing`` manager (a spawned server process: seconds to start on a small machine, and
killed by a SIGTERM to the process group before ``trainer.save_on_signal`` can write).
"""

from __future__ import annotations

import functools
import os
import queue
import threading

#: The forked writer's process name (``ps``, ``top``, ``/proc/PID/comm``).
WRITER_PROCESS_NAME = "loong-writer"

#: Seconds to wait for a finished writer's results to arrive through the pipe.
RESULTS_TIMEOUT_S = 60.0


class ResultsQueue:
    """The queue megatron-core's file writer puts its results into, readable by the saving process
    whether the writer ran in it (a synchronous save) or in a forked child (an asynchronous one).

    A child's ``put`` goes through a pipe that a thread of the owning process empties at once, so
    that a large result never blocks the child's exit (which the saving process waits for before
    it reads).
    """

    def __init__(self):
        import multiprocessing

        self._owner = os.getpid()
        self._local: queue.Queue = queue.Queue()
        self._pipe = multiprocessing.get_context("fork").SimpleQueue()
        self._reader = threading.Thread(target=self._drain, name="loong-ckpt-results", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                self._local.put(self._pipe.get())
            except (EOFError, OSError):
                return

    def put(self, item) -> None:
        if os.getpid() == self._owner:
            self._local.put(item)
        else:
            self._pipe.put(item)

    def get_nowait(self):
        """The next result; waits up to :data:`RESULTS_TIMEOUT_S` for one still in the pipe.

        Raises:
            queue.Empty: None came (the writer died before reporting).
        """
        return self._local.get(timeout=RESULTS_TIMEOUT_S)


def install_results_queue(asynchronous: bool) -> None:
    """Give megatron-core's file writer a results queue that works in this process.

    Args:
        asynchronous: Writers will run in forked children (a :class:`ResultsQueue`); otherwise a
            thread queue is enough, and one already installed is kept.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    current = filesystem_async._results_queue
    if asynchronous and not isinstance(current, ResultsQueue):
        filesystem_async._results_queue = ResultsQueue()
    elif current is None:
        filesystem_async._results_queue = queue.Queue()


def _writer_main(write, *args, **kwargs) -> None:
    """The forked writer: dies with the training process (no orphan writes on after a kill), and is
    named :data:`WRITER_PROCESS_NAME` so that ``ps`` tells it from the training process."""
    from loong_core.reaper import die_with_parent, name_this_process

    die_with_parent()
    name_this_process(WRITER_PROCESS_NAME)
    write(*args, **kwargs)


class McoreAsyncWrite:
    """One asynchronous dist_checkpointing save in flight.

    Args:
        request: The ``AsyncRequest`` that ``dist_checkpointing.save`` returned.
    """

    def __init__(self, request):
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        if request.async_fn is not None:
            request = request._replace(async_fn=functools.partial(_writer_main, request.async_fn))
        self.calls = AsyncCallsQueue(persistent=False)
        self.calls.schedule_async_request(request)

    def done(self) -> bool:
        # no_dist: this rank's writer only; the trainer agrees with the other ranks itself
        return all(call.async_caller.is_current_async_call_done(blocking=False, no_dist=True)
                   for call in self.calls.async_calls)

    def finish(self) -> None:
        self.calls.maybe_finalize_async_calls(blocking=True)  # joins the writer; collective

    def abort(self) -> None:
        for call in self.calls.async_calls:
            process = getattr(call.async_caller, "process", None)
            call.async_caller.close(abort=True)  # SIGKILL the writer
            if process is not None:
                process.join(timeout=10)  # and reap it (no zombie)
        self.calls.async_calls.clear()
