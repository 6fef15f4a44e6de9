"""A torch.profiler trace of chosen training steps (``trainer.profile``, Megatron's ``--profile``).

The steps ``profile_step_start`` up to, not including, ``profile_step_end`` (1-based step numbers
as in the logs, so Megatron's defaults 10 and 12 record two steps) are recorded on the ranks of
``profile_ranks``. Each recorded rank writes, under ``<run_dir>/profile/``:

- ``rank<R>.<stamp>.pt.trace.json``: the trace, in the layout TensorBoard's profiler plugin reads
  (``tensorboard --logdir <run_dir>/profile``) and that chrome://tracing or Perfetto open;
- ``rank<R>.ops.txt``: the ops table over the recorded steps, sorted by self time on the device
  (self CPU time on a CPU), each step and the data loading marked as its own record.

Recording starts before the first recorded step loads its batch and stops after the last step,
so the trace holds the data wait, the forward, backward, optimizer step and any collectives.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

OPS_TABLE_ROWS = 60
"""Rows of ``rank<R>.ops.txt``."""


class StepProfiler:
    """Records ``trainer.profile_step_start <= step < trainer.profile_step_end`` on this rank.

    Args:
        cfg: The ``trainer`` config.
        run_dir: The run's directory (the output goes to its ``profile/``).
        rank: This process's global rank.
        world_size: Ranks of the run (a rank of ``profile_ranks`` beyond it records nothing, with
            a warning).
        activities: What to record (``torch.profiler.ProfilerActivity`` values: the device
            backend's ``profiler_activities()``).
    """

    def __init__(self, cfg, run_dir: Path, rank: int, world_size: int, activities: list):
        self.start_step, self.end_step = cfg.profile_step_start, cfg.profile_step_end
        self.directory = Path(run_dir) / "profile"
        self.rank, self.activities = rank, activities
        self.record_shapes = cfg.profile_record_shapes
        self.with_stack = cfg.profile_with_stack
        ranks = list(cfg.profile_ranks)
        beyond = [r for r in ranks if r >= world_size]
        if cfg.profile and beyond and rank == 0:
            logger.warning("trainer.profile_ranks %s: no such rank in a run of %d; those record nothing",
                           beyond, world_size)
        self.enabled = bool(cfg.profile) and rank in ranks
        self._profiler = None

    def recording(self, step: int) -> bool:
        """Whether ``step`` (1-based) is one of the recorded steps."""
        return self.enabled and self.start_step <= step < self.end_step

    def before_step(self, step: int) -> None:
        """Start recording before the first recorded step loads its batch."""
        if self.recording(step) and self._profiler is None:
            from torch.profiler import profile, tensorboard_trace_handler

            self.directory.mkdir(parents=True, exist_ok=True)
            self._profiler = profile(
                activities=self.activities, record_shapes=self.record_shapes,
                with_stack=self.with_stack,
                on_trace_ready=tensorboard_trace_handler(str(self.directory), worker_name=f"rank{self.rank}"),
            )
            self._profiler.start()

    def step_scope(self, step: int, part: str):
        """A named record of ``part`` of ``step`` in the trace (nothing outside recorded steps)."""
        if self._profiler is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"loong.step_{step}.{part}")

    def after_step(self, step: int) -> None:
        """Stop after the last recorded step (or the run's last step) and write the outputs."""
        if self._profiler is not None and not self.recording(step + 1):
            self.finish()

    def finish(self) -> None:
        """Stop recording now (the end of the loop, also on an error) and write what was recorded."""
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        before = set(self.directory.glob(f"rank{self.rank}.*.pt.trace.json"))
        profiler.stop()
        sort = "self_cpu_time_total" if len(self.activities) == 1 else "self_device_time_total"
        table = profiler.key_averages(group_by_input_shape=self.record_shapes).table(
            sort_by=sort, row_limit=OPS_TABLE_ROWS)
        ops = self.directory / f"rank{self.rank}.ops.txt"
        ops.write_text(f"steps {self.start_step}..{self.end_step - 1}, sorted by {sort}\n{table}\n")
        traces = sorted(set(self.directory.glob(f"rank{self.rank}.*.pt.trace.json")) - before)
        logger.info("profile of steps %d-%d on rank %d written to %s (open with tensorboard --logdir %s)",
                    self.start_step, self.end_step - 1, self.rank, ", ".join(str(p) for p in [*traces, ops]),
                    self.directory)
