"""Throughput and MFU averaged over a logging interval (not the last step's)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

#: Short names of throughput units for the progress line.
SHORT_UNITS = {"tokens": "tok/s", "samples": "samples/s", "frames": "frames/s"}


class Throughput:
    """Accumulates items (tokens, samples, frames) and seconds of the steps of one interval.

    The interval average is ``sum(items) / sum(seconds)``: a slow step weighs as much as the time
    it took, so the number is what the interval really achieved.

    Args:
        unit: What the model's ``tokens_in`` counts: ``tokens``, ``samples`` or ``frames``.
        flops_per_item: Training FLOPs per item of the whole model; 0 or None when unknown
            (then no MFU is reported).
        peak_flops: Peak FLOP/s of all ranks together; None when the device does not know it
            (then MFU is known to be computable but shown as ``n/a``).
    """

    def __init__(self, unit: str, flops_per_item: float | None, peak_flops: float | None):
        self.unit = unit
        self.flops_per_item = flops_per_item or 0.0
        self.peak_flops = peak_flops
        self.items, self.seconds = 0.0, 0.0
        self._warned = False

    @property
    def key(self) -> str:
        """Metrics key of the rate: ``tokens_per_sec``, ``samples_per_sec``, ``frames_per_sec``."""
        return f"{self.unit}_per_sec"

    @property
    def reports_mfu(self) -> bool:
        """The model's FLOPs are known, so MFU is meaningful (a value, or n/a without a peak)."""
        return self.flops_per_item > 0

    def add(self, items: float, seconds: float) -> None:
        """Count one step."""
        self.items += items
        self.seconds += seconds

    def averages(self) -> dict[str, float]:
        """``{key: items/s}`` plus ``mfu`` (fraction of peak) when both FLOPs and peak are known."""
        rate = self.items / self.seconds if self.seconds > 0 else 0.0
        out = {self.key: rate}
        if self.reports_mfu and self.peak_flops:
            mfu = rate * self.flops_per_item / self.peak_flops
            if mfu > 1.0 and not self._warned:  # a peak below what ran: say so, never show > 100%
                logger.warning("measured %.3g FLOP/s exceed the device's peak %.3g FLOP/s; MFU is "
                               "capped at 100%% (set device.peak_tflops to the real peak)",
                               rate * self.flops_per_item, self.peak_flops)
                self._warned = True
            out["mfu"] = min(mfu, 1.0)
        return out

    def reset(self) -> None:
        """Start a new interval."""
        self.items, self.seconds = 0.0, 0.0
