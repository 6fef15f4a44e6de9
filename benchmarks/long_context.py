"""Peak memory and step time of a llama_debug-width model as the sequence grows, with and without
context parallelism and full recompute.

Every row is a fresh ``loong train experiment=llama_debug`` (hidden 64, 2 layers, 4 heads / 2 query
groups, vocabulary 512, fp32, micro-batch 1) of ``--steps`` steps at one sequence length:

* ``CP1``: one rank holds the whole sequence (2 threads). It runs on one rank because a second,
  data-parallel rank would hold an identical copy: its memory per rank and step time are the same.
* ``CP2``: ``parallel.context_parallel_size=2`` on 2 ranks (1 thread each), each holding half of
  every sequence.
* ``+rc``: ``parallel.recompute_granularity=full recompute_method=uniform recompute_num_layers=1``.
* ``+k4``: ``parallel.sequence_chunks=4``, the chunked schedule (the sequence through the model in 4
  chunks, K/V of earlier chunks kept, backward in reverse chunk order).

Columns: ``peak`` is the largest peak resident set (``VmHWM``) over the ranks of the run, ``base``
the same arm's peak at ``--base-seq`` tokens (imports, model, optimizer, data loader: what does not
scale with the sequence), ``act`` = ``peak - base`` and ``KiB/tok`` = ``act`` per token a rank holds
(``seq / CP``), ``marg`` the growth of ``act`` per added token since the row above (the slope,
free of the intercept that the base leaves). Flat memory means ``marg`` (and, as the intercept
fades, ``KiB/tok``) does not grow down an arm. ``step`` is the mean step
time of the steps after the first, in seconds (2 CPU cores shared by all ranks, and by whatever
else runs on the machine: read the times as rough).

``--set KEY=VALUE`` adds overrides to every run (e.g. ``kernels.linear_cross_entropy=chunked``).
``--mmap-threshold BYTES`` sets glibc's ``MALLOC_MMAP_THRESHOLD_`` for the runs: tensors above it
are mapped and unmapped one by one instead of being carved from the heap, whose freed pieces stay
resident (glibc raises its threshold on the fly, so by default large activations end up on the
heap), so the peak RSS comes close to the peak of live tensors.
Rows whose estimated peak does not fit in ``--max-gib`` are skipped and named.
``--before DIR`` compares code versions: every row also runs with the packages of the checkout in
``DIR`` first on ``PYTHONPATH`` (e.g. ``git archive COMMIT | tar -x -C DIR``), interleaved with
this tree's run of the same row (``code`` column: ``before`` / ``now``).
``--interleave-arms`` runs the arms of one sequence length back to back (all lengths of one arm
otherwise), so arms compared by their ratio see the same load on a shared machine.

Usage: python benchmarks/long_context.py [--seqs 4096 8192 16384 32768] [--arms cp1 cp1+rc cp2 cp2+rc]
       [--steps 3] [--set kernels.linear_cross_entropy=chunked] [--mmap-threshold 131072]
       [--before DIR] [--interleave-arms]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil

RECOMPUTE = ["parallel.recompute_granularity=full", "parallel.recompute_method=uniform",
             "parallel.recompute_num_layers=1"]
ARMS = {  # name -> (context-parallel size = ranks, recompute, sequence chunks)
    "cp1": (1, False, 1), "cp1+rc": (1, True, 1), "cp2": (2, False, 1), "cp2+rc": (2, True, 1),
    "cp1+rc+k4": (1, True, 4), "cp2+rc+k4": (2, True, 4),
}
DEFAULT_ARMS = ["cp1", "cp1+rc", "cp2", "cp2+rc"]


def _hwm_bytes(pid: int) -> int:
    """Peak resident set of a process (``VmHWM``), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _watch_ranks(proc: subprocess.Popen, peaks: dict[int, int], stop: threading.Event) -> None:
    """Record the peak RSS of every rank (a descendant with ``RANK`` in its environment)."""
    ranks: dict[int, int] = {}  # pid -> rank
    while not stop.is_set():
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        for child in children:
            if child.pid not in ranks:
                try:
                    rank = child.environ().get("RANK")
                    cmdline = " ".join(child.cmdline())
                except psutil.Error:
                    continue
                if rank is None or "loong" not in cmdline:
                    continue
                ranks[child.pid] = int(rank)
        for pid, rank in ranks.items():
            peaks[rank] = max(peaks.get(rank, 0), _hwm_bytes(pid))
        stop.wait(0.05)


def _pythonpath(src: str | None) -> dict:
    """Environment that imports the loong packages of the checkout ``src`` (None: this one)."""
    if src is None:
        return {}
    paths = sorted(str(p) for p in Path(src).glob("loong_*/src"))
    return {"PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def run(seq: int, cp: int, recompute: bool, steps: int, extra: list[str],
        mmap_threshold: int | None = None, src: str | None = None, chunks: int = 1) -> dict:
    """One training run; returns per-rank peak bytes, step times and the losses."""
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [
            "experiment=llama_debug", f"data.seq_length={seq}", f"model.max_position_embeddings={seq}",
            "trainer.micro_batch_size=1", "trainer.global_batch_size=1", f"trainer.train_iters={steps}",
            "trainer.log_interval=1", "trainer.eval_interval=0", "trainer.eval_at_start=false",
            "trainer.save_at_end=false", "trainer.progress_bar=false", "trainer.tensorboard=false",
            f"parallel.context_parallel_size={cp}", f"device.num_threads={2 // cp}",
            f"trainer.run_dir={run_dir}", f"parallel.sequence_chunks={chunks}",
            *(RECOMPUTE if recompute else []), *extra]
        cmd = [sys.executable, "-m", "loong_core.cli.main", "train", *overrides, "--nproc-per-node", str(cp)]
        env = {**os.environ, "OMP_NUM_THREADS": str(2 // cp), **_pythonpath(src)}
        if mmap_threshold is not None:
            env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
        peaks: dict[int, int] = {}
        stop = threading.Event()
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
            watcher = threading.Thread(target=_watch_ranks, args=(proc, peaks, stop), daemon=True)
            watcher.start()
            code = proc.wait()
            stop.set()
            watcher.join()
            if code != 0:
                out.seek(0)
                raise RuntimeError(f"run failed ({code}): {' '.join(cmd)}\n{out.read()[-4000:]}")
        records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
        train = sorted((r for r in records if r["split"] == "train"), key=lambda r: r["step"])
    # Rank 0's own getrusage peak (exact) is in its metrics; the watcher samples every rank.
    peaks[0] = max(peaks.get(0, 0), int(train[-1]["max_mem_gib"] * 2**30))
    return {"peaks": [peaks[r] for r in sorted(peaks)], "step_times": [r["step_time"] for r in train],
            "losses": [r["loss"] for r in train]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--base-seq", type=int, default=256)
    parser.add_argument("--max-gib", type=float, default=20.0, help="skip rows estimated above this")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--mmap-threshold", type=int, help="MALLOC_MMAP_THRESHOLD_ of the runs (bytes)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--before", metavar="DIR", help="also run every row with the checkout in DIR")
    parser.add_argument("--interleave-arms", action="store_true",
                        help="run the arms of one sequence length back to back")
    args = parser.parse_args()
    gib, mib = 2**30, 2**20
    rows, skipped = [], []
    print(f"overrides: {' '.join(args.extra) or '(none)'}; mmap threshold {args.mmap_threshold or 'glibc default'}; "
          f"steps {args.steps}; times on a shared 2-core machine")
    codes = [("before", args.before), ("now", None)] if args.before else [("now", None)]
    print("| arm | code | seq | tokens/rank | peak GiB (per rank) | base GiB | act MiB | KiB/tok | marg | step s "
          "| loss[-1] |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    lanes = [(arm, code, src) for arm in args.arms for code, src in codes]
    base = {}  # (arm, code) -> peak bytes at --base-seq
    for arm, code, src in lanes:
        cp, recompute, chunks = ARMS[arm]
        base[arm, code] = max(run(args.base_seq, cp, recompute, 2, args.extra, args.mmap_threshold, src,
                                  chunks)["peaks"])
    if args.interleave_arms:
        order = [(seq, lane) for seq in args.seqs for lane in lanes]
    else:  # the versions of one row (code) still run back to back
        order = [(seq, lane) for arm in args.arms for seq in args.seqs for lane in lanes if lane[0] == arm]
    previous = {}  # (arm, code) -> (tokens per rank, act bytes) of the last row, to extrapolate the next
    for seq, (arm, code, src) in order:
        cp, recompute, chunks = ARMS[arm]
        tokens, lane = seq // cp, (arm, code)
        if lane in previous:
            # Quadratic growth is the worst case the table checks for.
            estimate = base[lane] + previous[lane][1] * (tokens / previous[lane][0]) ** 2
            if estimate > args.max_gib * gib:
                skipped.append(f"{arm} {code} seq {seq}: estimated {estimate / gib:.1f} GiB "
                               f"> {args.max_gib} GiB")
                continue
        result = run(seq, cp, recompute, args.steps, args.extra, args.mmap_threshold, src, chunks)
        peak = max(result["peaks"])
        act = peak - base[lane]
        last = previous.get(lane)
        marginal = "-" if last is None else f"{(act - last[1]) / 1024 / (tokens - last[0]):.1f}"
        previous[lane] = (tokens, act)
        later = result["step_times"][1:] or result["step_times"]
        row = dict(arm=arm, code=code, seq=seq, tokens=tokens, peaks=result["peaks"], base=base[lane],
                   act=act, step=statistics.mean(later), loss=result["losses"][-1])
        rows.append(row)
        per_rank = " / ".join(f"{p / gib:.2f}" for p in result["peaks"])
        print(f"| {arm} | {code} | {seq} | {tokens} | {per_rank} | {base[lane] / gib:.2f} | {act / mib:.0f} | "
              f"{act / 1024 / tokens:.1f} | {marginal} | {row['step']:.2f} | {row['loss']:.4f} |", flush=True)
    for line in skipped:
        print(f"skipped: {line}")
    if args.json:
        Path(args.json).write_text(json.dumps({"overrides": args.extra, "mmap_threshold": args.mmap_threshold,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
