"""Where the wall time of a short `loong train` goes: start-up, the steps, the save, and the exit.

Runs `loong train experiment=llama_debug` for one step with a checkpoint (what most tests and a
user's first try do) on 1 and 2 ranks, and timestamps the lines the run prints as they arrive:
the launcher's first line, the first step's line, "saved checkpoint", "done", and the process's
exit. Prints the median of each phase over the repeats.

Usage: python benchmarks/run_overhead.py [--repeats N] [--ranks 1 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

OVERRIDES = ["experiment=llama_debug", "model.num_layers=4", "trainer.log_interval=1",
             "trainer.eval_interval=0", "trainer.progress_bar=false", "trainer.tensorboard=false",
             "trainer.train_iters=1"]
#: (phase name, text of the line that ends it); "exit after the run" ends when the process does.
MARKS = [("launcher start", "starting"), ("imports, data, model, step", "step 1/1"),
         ("checkpoint save", "saved checkpoint"), ("run end", "done: run directory")]


def one_run(ranks: int) -> dict[str, float]:
    """Seconds of each phase of one run."""
    exe = shutil.which("loong")
    cmd = [exe] if exe else [sys.executable, "-m", "loong_core.cli.main"]
    run_dir = tempfile.mkdtemp(prefix="loong-overhead-")
    cmd += ["train", *OVERRIDES, f"trainer.run_dir={run_dir}", "--nproc-per-node", str(ranks)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    seen: dict[str, float] = {}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        for line in proc.stdout:
            for _, text in MARKS:
                if text in line and text not in seen:
                    seen[text] = time.perf_counter() - start
        code = proc.wait()
    ended = time.perf_counter() - start
    shutil.rmtree(run_dir, ignore_errors=True)
    if code != 0 or len(seen) != len(MARKS):
        raise SystemExit(f"the run failed or printed less than expected ({code}): {' '.join(cmd)}")
    phases, previous = {}, 0.0
    for name, text in MARKS:
        phases[name] = seen[text] - previous
        previous = seen[text]
    phases["exit after the run"] = ended - previous
    phases["total"] = ended
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    one_run(1)  # warm the file cache and the data cache
    results = {ranks: [one_run(ranks) for _ in range(args.repeats)] for ranks in args.ranks}
    names = list(results[args.ranks[0]][0])
    print(f"{'phase (median s)':<28}" + "".join(f"{f'{r} rank(s)':>12}" for r in args.ranks))
    for name in names:
        print(f"{name:<28}" + "".join(f"{statistics.median(run[name] for run in results[r]):>12.2f}"
                                      for r in args.ranks))


if __name__ == "__main__":
    main()
