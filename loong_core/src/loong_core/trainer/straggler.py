"""Name the rank that slows a synchronous run down (``trainer.straggler_factor``).

In synchronous training every rank ends a step together: the fast ones wait for the slowest in
the gradient reduction, so the wall time of a step is the same everywhere and cannot tell who
is slow. What differs is the work each rank does on its own before it waits: loading its batch
and running its model's forward. That is what is timed (as Megatron-LM's straggler detector
times the forward step), on the last step of each logging interval only, with the device
synchronised around the forward so that a GPU's queued work is counted. Each rank contributes
one number to one ``all_gather``; rank 0 compares every rank with the median of the other ranks
of its pipeline stage (stages do different work) and logs a WARNING naming a rank that took
more than ``straggler_factor`` times as long, with its host.

Collectives inside the forward (tensor parallelism, FSDP's parameter all-gathers) make the
peers of a slow rank wait for it there too, so with those the slow rank's group is named.
"""

from __future__ import annotations

import logging
import socket
import statistics
import time

import torch

logger = logging.getLogger(__name__)

#: A rank must also be this many seconds slower than the median to be named (timer noise).
MIN_EXCESS_S = 0.001


def against_peers(times: list[float], stages: list[int]) -> list[tuple[int, float, float]]:
    """``(rank, time, median of the other ranks of its pipeline stage)`` for each rank that has
    such peers."""
    rows = []
    for rank, (own, stage) in enumerate(zip(times, stages)):
        others = [t for r, (t, s) in enumerate(zip(times, stages)) if s == stage and r != rank]
        if others:
            rows.append((rank, own, statistics.median(others)))
    return rows


def stragglers(times: list[float], stages: list[int], factor: float) -> list[tuple[int, float, float]]:
    """Ranks whose time exceeds ``factor`` times the median of the other ranks of their stage
    (and the median by more than :data:`MIN_EXCESS_S`).

    Args:
        times: Seconds per rank.
        stages: Pipeline stage per rank (ranks are compared within their stage).
        factor: Threshold ratio (> 1).

    Returns:
        ``(rank, time, median of the others)`` of each straggler, slowest first.
    """
    found = [(rank, own, median) for rank, own, median in against_peers(times, stages)
             if own > factor * median and own - median > MIN_EXCESS_S]
    return sorted(found, key=lambda row: row[1] / max(row[2], 1e-12), reverse=True)


class StragglerMonitor:
    """Times each rank's own share of a step and names the slow ranks (collective).

    Args:
        model: The engine's model: a module or a list of model chunks (wrappers such as DDP
            are looked through, so that their own collectives are not timed); None: only the
            batch loading is timed.
        device: The device backend (``synchronize``, ``torch_device``).
        factor: ``trainer.straggler_factor``.
        pipeline_size: Pipeline stages; megatron-core places stages outermost, so the stage of
            global rank ``r`` is ``r // (world // pipeline_size)``.
    """

    def __init__(self, model, device, factor: float, pipeline_size: int = 1):
        self.device, self.factor = device, factor
        self.rank, self.world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        per_stage = max(self.world // max(pipeline_size, 1), 1)
        self.stages = [r // per_stage for r in range(self.world)]
        self._measuring = False
        self._started = self._data = self._forward = 0.0
        self._entered = None
        self._hosts: list[str] | None = None
        chunks = model if isinstance(model, (list, tuple)) else [model] if model is not None else []
        for chunk in chunks:
            inner = getattr(chunk, "module", None)
            module = inner if isinstance(inner, torch.nn.Module) else chunk
            module.register_forward_pre_hook(self._forward_starts)
            module.register_forward_hook(self._forward_ends)

    def _forward_starts(self, module, args) -> None:
        if self._measuring:
            self.device.synchronize()
            self._entered = time.perf_counter()

    def _forward_ends(self, module, args, output) -> None:
        if self._measuring and self._entered is not None:
            self.device.synchronize()
            self._forward += time.perf_counter() - self._entered
            self._entered = None

    def start(self, measure: bool) -> None:
        """A step begins (before its batch is loaded); ``measure``: time this one."""
        self._measuring = measure
        self._data = self._forward = 0.0
        self._started = time.perf_counter()

    def batch_loaded(self) -> None:
        """This rank has its micro batches; its forward comes next."""
        self._data = time.perf_counter() - self._started

    def report(self, step: int) -> dict[str, float]:
        """Gather the measured step's times (every rank calls it on the same steps) and warn on
        rank 0 about stragglers.

        Returns:
            ``{"straggler_ratio": slowest rank's time / the median of its stage's others}``.
        """
        self._measuring = False
        mine = torch.tensor([self._data + self._forward], dtype=torch.float64, device=self.device.torch_device)
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        torch.distributed.all_gather(gathered, mine)
        times = [float(t.item()) for t in gathered]
        if self._hosts is None:
            self._hosts = [""] * self.world
            torch.distributed.all_gather_object(self._hosts, socket.gethostname())
        if self.rank == 0:
            for rank, own, median in stragglers(times, self.stages, self.factor):
                stage = f" of pipeline stage {self.stages[rank]}" if max(self.stages) else ""
                logger.warning(
                    "straggler: rank %d (host %s) step time %.3f s at step %d against a median of %.3f s "
                    "over the other ranks%s (%.1fx, trainer.straggler_factor=%g; timed: loading its "
                    "batch and its forward). A slow device, a busy host or slow storage there slows "
                    "every rank down to its pace.",
                    rank, self._hosts[rank], own, step, median, stage, own / max(median, 1e-12), self.factor)
        ratios = [own / median for _, own, median in against_peers(times, self.stages) if median > 0]
        return {"straggler_ratio": max(ratios)} if ratios else {}
