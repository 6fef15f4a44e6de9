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

    A resumed run first drops the records of steps after its checkpoint (written by the run that
    stopped after saving it), so the file holds one record per step and split however often the
    run is resumed; TensorBoard events after that step are purged the same way.

    Args:
        run_dir: Run directory.
        tensorboard: Also write TensorBoard event files under ``run_dir/tensorboard``.
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self.tensorboard = tensorboard
        self._file = None
        self._tb = None

    def start(self, step: int = 0) -> None:
        """Open the sinks to continue after ``step`` (0: a fresh run)."""
        if self._file is not None:
            return
        if step and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and _step_of(line) <= step]
            dropped = sum(1 for line in self.path.read_text().splitlines() if line.strip()) - len(kept)
            if dropped:
                tmp = self.path.with_suffix(".jsonl.tmp")
                tmp.write_text("".join(line + "\n" for line in kept))
                tmp.replace(self.path)
                logger.info("metrics.jsonl: dropped %d records after step %d (resumed there)",
                            dropped, step)
        self._file = open(self.path, "a", buffering=1)
        if self.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"),
                                         purge_step=step + 1 if step else None)
            except ImportError:
                logger.warning("tensorboard is not installed; pip install tensorboard for event files")

    def write(self, step: int, metrics: dict, split: str = "train") -> None:
        """Record ``metrics`` of ``step`` (NaN/inf are written as null)."""
        self.start()
        record = {"step": step, "split": split, "time": time.time()}
        for key, value in metrics.items():
            value = float(value)
            record[key] = value if math.isfinite(value) else None
            if self._tb is not None and math.isfinite(value):
                self._tb.add_scalar(f"{split}/{key}", value, step)
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Flush and close the sinks."""
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()



def _step_of(line: str) -> float:
    try:
        return float(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return float("inf")  # a torn last line of a killed run: dropped
