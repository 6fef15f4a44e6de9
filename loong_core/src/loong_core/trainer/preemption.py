"""``trainer.save_on_signal``: SIGTERM stops the run after the current step, with a checkpoint.

A scheduler sends SIGTERM before it preempts or cancels a job; under torchrun the launcher
forwards it to every worker. Each rank's handler only notes the signal; after every step the
ranks agree (one all-reduce of a flag, MAX), so they all stop after the same step, write one
checkpoint together and exit cleanly, and ``trainer.resume=auto`` continues from it.
"""

from __future__ import annotations

import signal
import threading

import torch


class SignalStop:
    """Notes SIGTERM and tells the loop, collectively, when to stop.

    Args:
        enabled: ``trainer.save_on_signal``; when false nothing is installed and
            :meth:`requested` is always false (no collective).
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.received: int | None = None
        self._previous = None

    def install(self) -> None:
        """Handle SIGTERM in this process (main thread only; elsewhere signals cannot be set)."""
        if self.enabled and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum, frame) -> None:
        self.received = signum

    def uninstall(self) -> None:
        """Restore the previous SIGTERM handler."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def requested(self, device) -> bool:
        """Whether any rank has received SIGTERM (collective when enabled)."""
        if not self.enabled:
            return False
        flag = torch.tensor([0.0 if self.received is None else 1.0], device=device.torch_device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())
