"""Wall time of `loong --help` and `loong plugins` with every installed plugin (target < 0.5 s).

Usage: python benchmarks/cli_startup.py [--repeats N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = [["--help"], ["plugins"], ["plugins", "--json"], ["config", "groups"]]


def measure(args: list[str], repeats: int) -> list[float]:
    exe = shutil.which("loong")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "loong_core.cli.main", *args]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    measure(["--help"], 1)  # warm the file cache
    print(f"{'command':<24}{'median s':>10}{'min s':>10}{'max s':>10}")
    for command in COMMANDS:
        times = measure(command, args.repeats)
        print(f"{'loong ' + ' '.join(command):<24}{statistics.median(times):>10.3f}"
              f"{min(times):>10.3f}{max(times):>10.3f}")


if __name__ == "__main__":
    main()
