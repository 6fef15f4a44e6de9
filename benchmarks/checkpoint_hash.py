"""Cost of the per-file checksums of a checkpoint (``loong_core.checkpoint.integrity``).

Writes a ~1.5 GB torch-DCP checkpoint (fp32 tensors the sizes of a 125M-parameter model's weights
and Adam moments) through the atomic store, then times, interleaved over ``--repeats`` rounds:
the DCP write, the checksums taken at save time, and the verification done before a load.

    python benchmarks/checkpoint_hash.py [--gb 1.5] [--repeats 3] [--dir /tmp/ckpt_bench]

Prints a table (seconds and MB/s; the DCP write is there for scale).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def _state(gigabytes: float):
    import torch

    numel = int(gigabytes * (1 << 30) / 4)
    sizes, chunk = [], 32 << 20  # 128 MB tensors, like large weight matrices
    while numel > 0:
        sizes.append(min(chunk, numel))
        numel -= sizes[-1]
    generator = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(n, generator=generator) for i, n in enumerate(sizes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()

    import torch.distributed.checkpoint as dcp

    from loong_core.checkpoint import integrity, store

    root = Path(args.dir or tempfile.mkdtemp(prefix="ckpt_hash_"))
    state = _state(args.gb)
    times = {"DCP write": [], "checksums at save": [], "verify before load": []}
    size = 0
    for round_ in range(args.repeats):
        shutil.rmtree(root, ignore_errors=True)
        started = time.perf_counter()
        path = store.save_collective(root, round_, lambda d: dcp.save({"model": state}, checkpoint_id=d),
                                     record={}, rng_state={})
        total = time.perf_counter() - started
        started = time.perf_counter()
        integrity.collective_checksums(path, skip=(store.COMPLETE_FILE,))
        times["checksums at save"].append(time.perf_counter() - started)
        times["DCP write"].append(total - times["checksums at save"][-1])
        started = time.perf_counter()
        store.verify_checkpoint(path)
        times["verify before load"].append(time.perf_counter() - started)
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    shutil.rmtree(root, ignore_errors=True)
    mb = size / 1e6
    print(f"checkpoint: {mb:.0f} MB in {len(state)} tensors, {args.repeats} rounds (median)")
    print(f"{'step':<22}{'seconds':>10}{'MB/s':>10}")
    for name, values in times.items():
        seconds = statistics.median(values)
        print(f"{name:<22}{seconds:>10.2f}{mb / seconds:>10.0f}")


if __name__ == "__main__":
    main()
