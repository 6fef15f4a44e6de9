"""Metric sinks of the logging rank: ``metrics.jsonl`` and TensorBoard event files."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

logger = logging.getLogger(__name__)


class MetricsWriter:
    """Appends one JSON object per record to ``metrics.jsonl`` and mirrors scalars to TensorBoard.

    Args:
        run_dir: Run directory.
        tensorboard: Also write TensorBoard event files under ``run_dir/tensorboard``.
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.path = run_dir / "metrics.jsonl"
        self._file = open(self.path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            except ImportError:
                logger.warning("tensorboard is not installed; pip install tensorboard for event files")

    def write(self, step: int, metrics: dict, split: str = "train") -> None:
        """Record ``metrics`` of ``step`` (NaN/inf are written as null)."""
        record = {"step": step, "split": split, "time": time.time()}
        for key, value in metrics.items():
            value = float(value)
            record[key] = value if math.isfinite(value) else None
            if self._tb is not None and math.isfinite(value):
                self._tb.add_scalar(f"{split}/{key}", value, step)
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Flush and close the sinks."""
        self._file.close()
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()

