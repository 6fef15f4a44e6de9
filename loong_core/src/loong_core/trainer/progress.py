"""Rank-0 progress: a bar on a terminal, one log line per interval everywhere."""

from __future__ import annotations

import logging
import sys
import time

from loong_core.trainer.throughput import SHORT_UNITS

logger = logging.getLogger("loong.train")


def _eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """Shows step, loss, throughput in the model's unit, MFU, memory and ETA.

    Throughput and MFU are the averages of the current logging interval
    (:class:`~loong_core.trainer.throughput.Throughput`), not the last step's.

    Args:
        total: Last iteration.
        start: First iteration (after resume).
        enabled: Whether this rank displays anything (local rank 0 of the logging rank).
        bar: Draw a tqdm bar (only when stderr is a terminal).
        unit: ``tokens``, ``samples`` or ``frames`` (the metrics key is ``<unit>_per_sec``).
        show_mfu: The model's FLOPs are known: show MFU (``n/a`` when the device has no peak);
            False omits it.
    """

    def __init__(self, total: int, start: int, enabled: bool, bar: bool, unit: str = "tokens",
                 show_mfu: bool = True):
        self.total, self.start, self.enabled = total, start, enabled
        self.unit, self.show_mfu = unit, show_mfu
        self._started = time.perf_counter()
        self._bar = None
        if enabled and bar and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, dynamic_ncols=True,
                             bar_format="step {n_fmt}/{total_fmt} |{bar}| {desc}")

    def eta(self, step: int) -> float:
        """Seconds left at the average pace since start."""
        done = step - self.start
        elapsed = time.perf_counter() - self._started
        return elapsed / done * (self.total - step) if done > 0 else float("nan")

    def update(self, step: int, metrics: dict, log_line: bool) -> None:
        """Advance to ``step``; print a log line when ``log_line``."""
        if not self.enabled:
            return
        eta = self.eta(step)
        rate = metrics.get(f"{self.unit}_per_sec", 0.0)
        fields = {
            "loss": f"{metrics['loss']:.4f}",
            SHORT_UNITS.get(self.unit, f"{self.unit}/s"): f"{rate:.0f}" if rate >= 10 else f"{rate:.2f}",
        }
        if self.show_mfu:
            fields["mfu"] = f"{100 * metrics['mfu']:.1f}%" if "mfu" in metrics else "n/a"
        if "mem_gib" in metrics:
            fields["mem"] = f"{metrics['mem_gib']:.1f}G"
        fields["eta"] = _eta(eta) if eta == eta else "?"
        if self._bar is not None:
            self._bar.set_description_str(" ".join(f"{k} {v}" for k, v in fields.items()), refresh=False)
            self._bar.update(step - self._bar.n)
        if log_line:
            text = " | ".join(f"{k} {v}" for k, v in fields.items())
            message = f"step {step}/{self.total} | {text} | lr {metrics.get('lr', 0):.3g}"
            if self._bar is not None:
                self._bar.write(message, file=sys.stderr)
            else:
                logger.info(message)

    def note(self, message: str) -> None:
        """Print a message without breaking the bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            logger.info(message)

    def close(self) -> None:
        """Remove the bar."""
        if self._bar is not None:
            self._bar.close()
