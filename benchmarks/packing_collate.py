"""Time and memory of building a packed micro batch: dense ``[s, s]`` masks against segment ids.

Arms (one micro batch of ``--batch`` packed samples, ``--docs`` documents each, at ``--seq``):

- ``dense mask`` (before): every sample carries the block-diagonal causal ``bool [1, s, s]`` mask
  (``loong_llm.data.packing.block_causal_mask``), collated into ``[b, 1, s, s]``; the seam's core
  attention then turned it back into segment ids once per forward (``mask_to_pattern``, timed
  separately).
- ``segment ids`` (after): every sample carries ``int32 [s]`` segment ids, collated into
  ``[b, s]`` and wrapped as a ``SegmentMask`` in the forward step (nothing to convert).

Per arm: milliseconds to build and collate the batch, the batch's bytes, the peak RSS above the
process's footprint while building it (each measurement in its own process; arms interleaved
over the repeats), and the seam's per-forward conversion time.

Usage: python benchmarks/packing_collate.py [--seq 8192] [--batch 4] [--docs 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

ARMS = ("dense mask", "segment ids")


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def _samples(seq: int, batch: int, docs: int, dense: bool) -> list[dict]:
    import numpy as np

    from loong_llm.data.packing import block_causal_mask, packed_sample

    rng = np.random.default_rng(0)
    samples = []
    for _ in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, seq), size=docs - 1, replace=False))
        lengths = np.diff([0, *cuts, seq - 1])  # leave one padded position
        items = [(rng.integers(1, 1000, size=n + 1), np.ones(n + 1, dtype=np.float32)) for n in lengths]
        sample = packed_sample(items, seq, pad_id=0)
        if dense:  # the old sample: the dense mask instead of the ids
            del sample["segment_ids"]
            sample["attention_mask"] = block_causal_mask(list(lengths), seq)
        samples.append(sample)
    return samples


def worker(arm: str, seq: int, batch: int, docs: int) -> dict:
    """One measurement (in a fresh process)."""
    import torch
    from torch.utils.data import default_collate

    from loong_core.kernels.segment_mask import with_attention_mask

    torch.set_num_threads(1)
    dense = arm == "dense mask"
    _samples(64, 1, 2, dense)  # warm imports
    base = _rss_kb()
    start = time.perf_counter()
    collated = default_collate(_samples(seq, batch, docs, dense))
    collated = with_attention_mask(collated)
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    nbytes = sum(t.numel() * t.element_size() for t in collated.values() if torch.is_tensor(t))
    convert_ms = 0.0
    if dense:
        from loong_core.engines.megatron.seam.modules import mask_to_pattern

        t0 = time.perf_counter()
        mask_to_pattern(collated["attention_mask"])
        convert_ms = (time.perf_counter() - t0) * 1e3
    return {"ms": elapsed * 1e3, "bytes": nbytes, "peak_kb": peak, "convert_ms": convert_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.seq, args.batch, args.docs)))
        return
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for _ in range(args.repeats):
        for arm in ARMS:  # interleaved
            cmd = [sys.executable, __file__, "--worker", arm, "--seq", str(args.seq), "--batch",
                   str(args.batch), "--docs", str(args.docs)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results[arm].append(json.loads(out.strip().splitlines()[-1]))
    print(f"seq {args.seq}, micro batch {args.batch} x {args.docs} documents, median of {args.repeats}")
    print("| arm | collate ms | batch MB | peak MB | seam mask->segments ms / forward |")
    print("|---|---|---|---|---|")
    for arm in ARMS:
        rows = results[arm]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"| {arm} | {med['ms']:.1f} | {med['bytes'] / 2**20:.2f} | {med['peak_kb'] / 1024:.1f} | "
              f"{med['convert_ms']:.1f} |")


if __name__ == "__main__":
    main()
