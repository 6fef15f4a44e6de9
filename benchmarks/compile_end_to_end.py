"""Does ``kernels=compile`` pay off end to end on CPU? Wall time of whole ``loong train`` runs.

Runs the same experiment (default: the default experiment at its default number of steps) with
each ``kernels=<option>`` arm in a fresh process, arms interleaved over the repeats, and prints
per arm: the wall time of the whole process (imports, data, model, ``torch.compile`` of every
op on its first call, training, evaluation, checkpoint), the median step time after the first
two steps, and the first logged step's time, with ratios to the first arm. An arm named
``<option>-cold`` runs ``kernels=<option>`` with an empty inductor cache
(``TORCHINDUCTOR_CACHE_DIR``): what the first compiled run on a machine pays; the plain
``compile`` arm reuses the cache earlier runs left (what every later run pays).

Usage: python benchmarks/compile_end_to_end.py [--arms torch compile] [--repeats 1] [-- OVERRIDES...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_arm(arm: str, overrides: list[str], root: Path, index: int) -> dict:
    run_dir = root / f"{arm}_{index}"
    option, cold = (arm[:-len("-cold")], True) if arm.endswith("-cold") else (arm, False)
    cmd = [sys.executable, "-m", "loong_core.cli.main", "train", f"kernels={option}", f"trainer.run_dir={run_dir}",
           "trainer.progress_bar=false", "trainer.tensorboard=false", *overrides]
    env = dict(os.environ)
    if cold:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(root / f"inductor_{arm}_{index}")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{arm} failed:\n{proc.stderr[-3000:]}")
    steps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("split") == "train" and "step_time" in row:
            steps[row["step"]] = row["step_time"]
    times = [steps[s] for s in sorted(steps)]
    return {"wall": wall, "first": times[0], "median": statistics.median(times[2:] or times),
            "logged": len(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=["torch", "compile"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="loong train overrides (after --)")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for arm in args.arms:  # interleaved
                results[arm].append(run_arm(arm, args.overrides, Path(tmp), i))
    base = statistics.median(r["wall"] for r in results[args.arms[0]])
    base_step = statistics.median(r["median"] for r in results[args.arms[0]])
    print(f"loong train {' '.join(args.overrides) or '(default experiment)'}; median of {args.repeats}")
    print("| kernels | wall s | vs first | first logged step s | median step s | step vs first |")
    print("|---|---|---|---|---|---|")
    for arm in args.arms:
        rows = results[arm]
        wall = statistics.median(r["wall"] for r in rows)
        step = statistics.median(r["median"] for r in rows)
        first = statistics.median(r["first"] for r in rows)
        print(f"| {arm} | {wall:.1f} | {wall / base:.2f} | {first:.2f} | {step:.3f} | {step / base_step:.2f} |")


if __name__ == "__main__":
    main()
