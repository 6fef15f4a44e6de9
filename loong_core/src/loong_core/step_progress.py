"""Progress of a fixed number of steps outside training (sampling, evaluation): a tqdm bar on a
terminal, else a log line at every tenth of the way."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)


class StepProgress:
    """Context manager counting ``total`` steps; ``update(done)`` after each.

    Args:
        total: Steps in all.
        desc: What is being done (``sampling``).
    """

    def __init__(self, total: int, desc: str):
        self.total, self.desc = total, desc
        self._bar = None
        self._next = max(1, total // 10)

    def __enter__(self) -> StepProgress:
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit="step", leave=False)
        return self

    def update(self, done: int) -> None:
        """``done`` steps are finished."""
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        elif done >= self._next or done == self.total:
            logger.info("%s: step %d/%d", self.desc, done, self.total)
            self._next = done + max(1, self.total // 10)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
