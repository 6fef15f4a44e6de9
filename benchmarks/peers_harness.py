"""The harness of ``benchmarks/peers.py``: each arm in a fresh process, arms interleaved round by
round, warmup steps dropped, median and fastest step per arm, one table per modality.

A modality module (``peers_dense``, ``peers_moe``, ``peers_dit``) provides:

* ``SHAPES``: ``{"default": {...}, "smoke": {...}}``;
* ``ARMS``: ``{arm: settings}``, the settings printed in the table's last column;
* ``UNIT``: what a step processes (``"tokens"``, ``"samples"``) and ``units(shape)`` how many;
* ``describe(shape)``: one line naming the shape;
* ``run(arm, shape, steps) -> list[float]``: step times in seconds (the first steps included).

The worker side (``--worker``) calls ``run`` and writes the times as JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def peer_autocast(precision: str):
    """What a peer's documented mixed precision does around its forward and loss.

    transformers' ``Trainer(bf16=True)`` and diffusers' training examples (``Accelerator(
    mixed_precision="bf16")``) both run the forward under ``torch.autocast`` on the CPU: fp32 weights,
    gradients and optimizer state, bf16 matrix products. ``"fp32"``: no autocast.

    Args:
        precision: ``"fp32"`` or ``"bf16"``.
    """
    import contextlib

    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    if precision != "bf16":
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    return torch.autocast("cpu", dtype=torch.bfloat16)


def run_worker(script: str, modality: str, arm: str, shape_name: str, steps: int, extra: Sequence[str] = (),
               timeout: float = 900, python: str | None = None, env: dict | None = None,
               cwd: str | None = None):
    """Run one arm in a fresh ``PYTHON SCRIPT --worker`` process; the JSON it wrote (its step times).

    Args:
        script: The benchmark script (its ``--worker`` mode runs the arm).
        modality: First ``--worker`` value (a modality, or a policy).
        arm: Second ``--worker`` value.
        shape_name: ``--shape``.
        steps: ``--steps``.
        extra: Further arguments.
        timeout: Seconds before the worker is killed.
        python: Interpreter (None: this one; another venv's for a peer that lives there).
        env: The worker's whole environment (None: this one with ``OMP_NUM_THREADS`` = all cores).
        cwd: Working directory of the worker.

    Raises:
        RuntimeError: The worker failed; the message holds the last line of its stderr.
    """
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [python or sys.executable, script, "--worker", modality, arm, "--shape", shape_name,
               "--steps", str(steps), "--out", out.name, *extra]
        if env is None:
            env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count())}
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{arm} timed out after {timeout:.0f} s") from None
        if result.returncode:
            lines = [line for line in result.stderr.strip().splitlines() if line.strip()] or ["no output"]
            raise RuntimeError(f"{arm} failed: {lines[-1][:200]}")
        return json.loads(Path(out.name).read_text())


def interleave(run_one, arms: Sequence[str], rounds: int, warmup: int) -> tuple[dict, dict]:
    """Run every arm once per round, in order, ``rounds`` times.

    Args:
        run_one: ``run_one(arm) -> step times`` (one fresh process).
        arms: Arm names, in the order of each round.
        rounds: Rounds.
        warmup: First steps of each process dropped.

    Returns:
        ``(times, notes)``: the kept step times of each arm that ran, and for each arm that failed
        the reason (its last failure).
    """
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    notes: dict[str, str] = {}
    for _ in range(rounds):
        for arm in arms:
            try:
                times[arm] += run_one(arm)[warmup:]
            except RuntimeError as exc:
                notes[arm] = str(exc)
    return {arm: t for arm, t in times.items() if t}, notes


def table(arms: dict[str, str], times: dict[str, list[float]], notes: dict[str, str], units: float,
          unit: str, baseline: str = "loong") -> list[str]:
    """Markdown rows: arm, median and fastest s/step, throughput, speed-up of ``baseline`` over the
    arm (the arm's step time / the baseline's: above 1 means the baseline is faster; a ``*_bf16``
    arm is compared with ``<baseline>_bf16`` where that ran, so each precision against its own) by
    the median, the fastest step and the mean step (the run's throughput over its timed steps: for
    arms whose step ``i`` trains on the same data, e.g. the VLM's records, the like-for-like one),
    the number of timed steps, settings. Arms that did not run show why."""
    rows = [f"| arm | median s/step | {unit}/s | {baseline} speed-up (median) | fastest s/step "
            f"| {baseline} speed-up (fastest) | {baseline} speed-up (mean) | steps | settings |",
            "|---|---|---|---|---|---|---|---|---|"]
    for arm, settings in arms.items():
        base = times.get(f"{baseline}_bf16") if arm.endswith("_bf16") else None
        base = base or times.get(baseline)
        if arm in times:
            t = times[arm]
            median, fastest = statistics.median(t), min(t)
            ratio = f"{median / statistics.median(base):.2f}x" if base else "n/a"
            best = f"{fastest / min(base):.2f}x" if base else "n/a"
            mean = f"{statistics.fmean(t) / statistics.fmean(base):.2f}x" if base else "n/a"
            rows.append(f"| {arm} | {median:.3f} | {units / median:.0f} | {ratio} | {fastest:.3f} | {best} "
                        f"| {mean} | {len(t)} | {settings} |")
        elif arm in notes:
            rows.append(f"| {arm} | - | - | - | - | - | - | 0 | not run: {notes[arm]} |")
    return rows
