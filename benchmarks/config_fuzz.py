"""Fuzz config overrides and print how validation answers them (a table, not a test).

Each example is 1-3 ``key=value`` overrides on ``experiment=llama_debug`` drawn from
``tests/config_fuzz_cases.py``. Counted: accepted, rejected with one ConfigError, any other
exception (a traceback for the user), and examples a known rule says are invalid but that passed.
With ``--train N``, the first N accepted examples also run ``loong train ... trainer.train_iters=1``.

    python benchmarks/config_fuzz.py --examples 1000 [--train 20]
"""

from __future__ import annotations

import argparse
import collections
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import config_fuzz_cases as cases  # noqa: E402

from loong_core.config.compose import load_config  # noqa: E402
from loong_core.errors import ConfigError  # noqa: E402


def draw(rng: random.Random) -> list[tuple[str, object]]:
    keys = sorted(cases.leaf_keys())
    pairs = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        key = rng.choice(keys)
        pairs.append((key, rng.choice(cases.value_pool(cases.leaf_keys()[key]))))
    return pairs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=0, help="accepted examples to train 1 step")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counts = collections.Counter()
    slipped, crashes, accepted = [], [], []
    for _ in range(args.examples):
        pairs = draw(rng)
        overrides = [cases.override(k, v) for k, v in pairs]
        try:
            load_config(cases.BASE + overrides)
        except ConfigError:
            counts["ConfigError"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - the point is to count these
            counts["other exception (traceback)"] += 1
            crashes.append(f"{' '.join(overrides)}: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        counts["accepted"] += 1
        accepted.append(overrides)
        bad = cases.known_invalid(pairs)
        if bad:
            counts["known-invalid accepted"] += 1
            slipped.append(" ".join(overrides))
    print(f"| outcome ({args.examples} examples, seed {args.seed}) | count |\n|---|---|")
    for key in ("accepted", "ConfigError", "other exception (traceback)", "known-invalid accepted"):
        print(f"| {key} | {counts[key]} |")
    for line in crashes[:40]:
        print("crash:", line)
    for line in slipped[:80]:
        print("slipped:", line)
    if args.train:
        outcomes = collections.Counter()
        with tempfile.TemporaryDirectory() as tmp:
            for i, overrides in enumerate(accepted[:args.train]):
                cmd = [sys.executable, "-m", "loong_core.cli.main", "train", *cases.BASE, *overrides,
                       "trainer.train_iters=1", "trainer.eval_interval=0", "trainer.save_at_end=false",
                       f"trainer.run_dir={tmp}/r{i}"]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                traceback = "Traceback" in proc.stderr
                kind = "trained" if proc.returncode == 0 else ("traceback" if traceback else "clean error")
                outcomes[kind] += 1
                if kind != "trained":
                    tail = proc.stderr.strip().splitlines()[-1:] or [""]
                    print(f"train {kind}: {' '.join(overrides)} -> {tail[0][:120]}")
        print(f"| train 1 step ({args.train} accepted) | count |\n|---|---|")
        for key in ("trained", "clean error", "traceback"):
            print(f"| {key} | {outcomes[key]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
