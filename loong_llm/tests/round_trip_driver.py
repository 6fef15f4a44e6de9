"""``loong convert`` HF -> loong -> HF of many cases with few process start-ups: the suite would
otherwise pay two CLI processes (and, for a sharded layout, a torchrun job) per case.

``python round_trip_driver.py JOBS.json OUT.json``: ``JOBS`` maps a case name to ``[work dir,
hf-to-loong arguments]`` (``--family F [--tp N] [--pp N] [--ep N] [--with-optimizer] SOURCE``).

* A one-rank case runs ``loong convert hf-to-loong ARGS... WORK/ckpt`` through the CLI's ``main``
  in this process (the same parser and commands as the ``loong`` executable).
* The sharded cases of one world size share one torchrun job: every rank runs, case after case,
  :func:`loong_llm.hf.convert.hf_to_loong_rank`, what ``loong convert`` launches on each rank.
* Every case then comes back through ``loong convert loong-to-hf WORK/ckpt WORK/out`` (CLI,
  this process).

``OUT`` maps each case to ``null`` or what went wrong; a failing case does not stop the others
(a failing rank fails every case of its torchrun job, whose output names the case).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path


def _hf_to_loong_args(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--with-optimizer", action="store_true")
    parser.add_argument("source")
    return parser.parse_args(args)


def _ranks(jobs_path: str, cases: list[str]) -> int:
    """One rank of a torchrun job converting ``cases`` in turn."""
    import logging

    from loong_llm.hf.convert import hf_to_loong_rank

    logging.basicConfig(level=logging.WARNING)
    jobs = json.loads(Path(jobs_path).read_text())
    for case in cases:
        work, args = jobs[case]
        a = _hf_to_loong_args(args)
        print(f"rank {os.environ.get('RANK')}: converting {case}", file=sys.stderr, flush=True)
        hf_to_loong_rank(a.family, a.source, str(Path(work) / "ckpt"), a.tp, a.pp, a.ep, {},
                         model_only=not a.with_optimizer)
    return 0


def _sharded(jobs_path: str, cases: list[str], world: int) -> str | None:
    """Run ``cases`` (all of ``world`` ranks) in one torchrun job; None or what failed."""
    from loong_core.launch import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
           "--master-port", str(free_port()), __file__, "--ranks", jobs_path, *cases]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    return None if result.returncode == 0 else (f"{world}-rank job {cases} failed ({result.returncode}):\n"
                                                f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")


def main(jobs_path: str, out_path: str) -> int:
    from loong_core.cli.main import main as loong

    jobs = json.loads(Path(jobs_path).read_text())
    results: dict[str, str | None] = {}
    worlds: dict[int, list[str]] = {}
    for case, (_work, args) in jobs.items():
        a = _hf_to_loong_args(args)
        worlds.setdefault(a.tp * a.pp * a.ep, []).append(case)
    for world, cases in sorted(worlds.items()):
        if world > 1:
            failure = _sharded(jobs_path, cases, world)
            results.update(dict.fromkeys(cases, failure))
    for case, (work, args) in jobs.items():
        ckpt, out = str(Path(work) / "ckpt"), str(Path(work) / "out")
        if results.get(case):
            continue
        try:
            codes = [] if case in results else [loong(["convert", "hf-to-loong", *args, ckpt])]
            codes.append(loong(["convert", "loong-to-hf", ckpt, out]))
            results[case] = None if set(codes) == {0} else f"exit codes {codes}"
        except BaseException:  # SystemExit from argparse included
            results[case] = traceback.format_exc()
    Path(out_path).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--ranks":
        sys.exit(_ranks(sys.argv[2], sys.argv[3:]))
    sys.exit(main(*sys.argv[1:]))
