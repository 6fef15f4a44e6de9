"""Stall per checkpoint, synchronous against asynchronous saves (``trainer.async_save``).

Runs ``loong train`` on a 100M+-parameter debug model for each engine, once with synchronous and
once with asynchronous saves (the same steps, a save every ``--interval`` steps), and reads the
time the training loop was blocked by each save from the run's ``saved checkpoint ... (training
blocked X s)`` lines: for a synchronous save the whole write; for an asynchronous one taking the
snapshot, the checks at the start of later steps and the commit. The last save of a run is written
synchronously either way and is left out of the median.

    python benchmarks/checkpoint_async.py [--engines megatron torch] [--steps 16] [--interval 5]

Prints a table: engine, parameters, checkpoint size, median stall per save (sync, async), their
ratio, and the summed train-step time of each run (the writer shares the CPU with training, so
the steps themselves get slower while an asynchronous write is in flight).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# About 106M parameters each: Llama width 1024 x 7 layers on the megatron engine, DiT width 1024 x
# 6 layers on the torch engine; one small micro batch per step.
MODELS = {
    "megatron": ["experiment=llama_debug", "model.hidden_size=1024", "model.num_layers=7",
                 "model.num_attention_heads=16", "model.num_query_groups=4", "model.ffn_hidden_size=4096",
                 "trainer.micro_batch_size=1", "trainer.global_batch_size=1"],
    "torch": ["experiment=dit_digits_debug", "model.hidden_size=1024", "model.num_layers=6",
              "model.num_attention_heads=16", "trainer.micro_batch_size=8", "trainer.global_batch_size=8"],
}
_SAVED = re.compile(r"saved checkpoint \S+iter_(\d+) \(training blocked ([\d.]+) s[):]")
_PARTS = re.compile(r"saved checkpoint \S+iter_(\d+) \(training blocked [\d.]+ s: ([^)]*)\)")
_PARAMS = re.compile(r"model: \S+ \(([\d.]+[KMB]?) parameters\)")


def _run(engine: str, asynchronous: bool, steps: int, interval: int, root: Path) -> dict:
    run_dir = root / f"{engine}-{'async' if asynchronous else 'sync'}"
    overrides = [*MODELS[engine], f"trainer.train_iters={steps}", f"trainer.save_interval={interval}",
                 f"trainer.async_save={str(asynchronous).lower()}", f"trainer.run_dir={run_dir}",
                 "trainer.log_interval=1", "trainer.eval_interval=0", "trainer.progress_bar=false",
                 "trainer.tensorboard=false"]
    proc = subprocess.run([sys.executable, "-m", "loong_core.cli.main", "train", *overrides],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{engine} run failed:\n{log[-3000:]}")
    stalls = {int(it): float(s) for it, s in _SAVED.findall(log)}
    parts = {int(it): dict((name, float(sec)) for name, sec in (p.rsplit(" ", 1) for p in text.split(", ")))
             for it, text in _PARTS.findall(log)}
    from loong_core.checkpoint import space
    from loong_core.testing import read_metrics

    size = space.checkpoint_size(run_dir / "checkpoints" / f"iter_{interval:07d}")
    step_time = sum(r["step_time"] for r in read_metrics(run_dir))
    params = _PARAMS.search(log).group(1)
    shutil.rmtree(run_dir, ignore_errors=True)
    interval_saves = [stalls[it] for it in sorted(stalls) if it != steps]
    interval_parts = [parts[it] for it in sorted(parts) if it != steps]
    return {"stalls": interval_saves, "size": size, "step_time": step_time, "params": params,
            "parts": interval_parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--interval", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the runs write (default: a temporary folder)")
    args = parser.parse_args()

    from loong_core.checkpoint.space import human_bytes

    root = Path(args.dir or tempfile.mkdtemp(prefix="ckpt_async_"))
    rows, details = [], []
    for engine in args.engines:
        sync = _run(engine, False, args.steps, args.interval, root)
        asy = _run(engine, True, args.steps, args.interval, root)
        s, a = statistics.median(sync["stalls"]), statistics.median(asy["stalls"])
        names = [name for name in asy["parts"][0]] if asy["parts"] else []
        details.append((engine, {n: statistics.median(p.get(n, 0.0) for p in asy["parts"]) for n in names}))
        rows.append((engine, sync["params"], human_bytes(sync["size"]), f"{s:.2f}", f"{a:.2f}",
                     f"1/{s / a:.1f}" if a else "-", f"{sync['step_time']:.1f}", f"{asy['step_time']:.1f}",
                     " ".join(f"{x:.2f}" for x in sync["stalls"]), " ".join(f"{x:.2f}" for x in asy["stalls"])))
    for engine, breakdown in details:
        print(f"{engine} async stall, median per part: " + ", ".join(f"{k} {v:.2f} s" for k, v in breakdown.items()))
    header = ("engine", "params", "checkpoint", "sync stall s", "async stall s", "async/sync",
              "steps sync s", "steps async s", "sync stalls", "async stalls")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)))
    print(f"\n{args.steps} steps, a save every {args.interval} (median over the interval saves; the last "
          "save is synchronous in both). 'steps' = summed train-step time of the run.")


if __name__ == "__main__":
    main()
