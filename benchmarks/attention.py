"""Peak memory and step time of llama_debug-shaped attention: the old path against the seam's.

Shape: ``llama_tiny`` (4 query heads, 2 KV groups, head dim 16), one sequence per micro batch.
Arms (fwd + bwd):

- ``old``: megatron-core's local ``DotProductAttention`` (what every family ran before the
  seam): materialised ``[b, h, s, s]`` scores, K/V repeated for GQA; packed documents as the dense
  boolean ``[b, 1, s, s]`` mask the data pipeline builds.
- ``eager``: the seam's reference (``kernels.attention=eager``), same math.
- ``sdpa``: the seam's default (``kernels.attention=sdpa``): SDPA with ``enable_gqa``; packed
  documents as segments (one SDPA call per group of equally long documents), no mask.

The ``packed, forward only`` rows compare the two varlen candidates on CPU, where FlexAttention
has no backward: per-document SDPA against FlexAttention (compiled, block mask) and SDPA with
the dense mask. Each measurement runs in its own process (peak RSS above the process's
footprint after setup); arms are interleaved over the repeats, so machine load hits all alike.

Usage: python benchmarks/attention.py [--seqs 2048 8192] [--repeats 2] [--steps 3] [--cases causal packed varlen]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time

HEADS, GROUPS, HEAD_DIM, DOCS = 4, 2, 16, 4


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def worker(arm: str, case: str, seq: int, steps: int, backward: bool) -> dict:
    """One measurement in this process: ``{"ms": median step, "peak_mb": peak above setup}``."""
    import torch

    from loong_core import kernels
    from loong_core.testing import megatron_single_rank

    torch.manual_seed(0)
    # FlexAttention does not compile under the cpu backend's megatron-core patches: the
    # forward-only candidates run without them.
    with megatron_single_rank() if backward else contextlib.nullcontext():
        from megatron.core.transformer.dot_product_attention import DotProductAttention
        from megatron.core.transformer.enums import AttnMaskType
        from megatron.core.transformer.transformer_config import TransformerConfig

        from loong_core.engines.megatron.seam.modules import SeamCoreAttention
        from loong_core.kernels import attention as attn

        config = TransformerConfig(num_layers=1, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                                   num_query_groups=GROUPS, attention_dropout=0.0,
                                   use_cpu_initialization=True, masked_softmax_fusion=False)
        shape = lambda n: (seq, 1, n, HEAD_DIM)  # noqa: E731
        q, k, v = (torch.randn(shape(n), requires_grad=backward) for n in (HEADS, GROUPS, GROUPS))
        mask = None
        segments = torch.arange(seq) * DOCS // seq  # DOCS equal documents
        if case == "packed":
            same = segments[:, None] == segments[None, :]
            mask = ~(same & torch.ones(seq, seq, dtype=torch.bool).tril())[None, None]
        if arm == "old":
            module = DotProductAttention(config, 1, AttnMaskType.causal, "self")
            run = lambda: module(q, k, v, mask)  # noqa: E731
        elif arm in ("eager", "sdpa"):
            kernels.configure({"attention": arm}, "cpu")
            module = SeamCoreAttention(config, 1, AttnMaskType.causal, "self")
            run = lambda: module(q, k, v, mask)  # noqa: E731
        else:  # forward-only varlen candidates on [b, h, s, d]
            qb, kb, vb = (t.detach().permute(1, 2, 0, 3).contiguous() for t in (q, k, v))
            seg = segments[None]
            fn = {"sdpa_segments": lambda: attn.sdpa(qb, kb, vb, causal=True, segment_ids=seg),
                  "sdpa_dense_mask": lambda: attn.sdpa(qb, kb, vb, causal=False, mask=~mask),
                  "flex_block_mask": lambda: attn.flex(qb, kb, vb, causal=True, segment_ids=seg)}[arm]
            run = fn
        if not backward:
            run()  # warm-up (compiles flex) before the footprint is taken
        base = _rss_kb()
        times = []
        for _ in range(steps + 1):
            start = time.perf_counter()
            if backward:
                run().sum().backward()
            else:
                with torch.no_grad():
                    run()
            times.append(time.perf_counter() - start)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"ms": 1000 * statistics.median(times[1:]), "peak_mb": max(peak - base, 0) / 1024}


def measure(arm, case, seq, steps, backward) -> dict:
    cmd = [sys.executable, __file__, "--worker", arm, case, str(seq), str(steps), str(int(backward))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=["causal", "packed", "varlen"],
                        help="causal, packed (fwd + bwd) and varlen (the forward-only candidates)")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        arm, case, seq, steps, backward = args.worker
        print(json.dumps(worker(arm, case, int(seq), int(steps), bool(int(backward)))))
        return
    plans = [(case, True, ("old", "eager", "sdpa")) for case in ("causal", "packed") if case in args.cases]
    if "varlen" in args.cases:
        plans.append(("packed", False, ("sdpa_segments", "sdpa_dense_mask", "flex_block_mask")))
    results: dict = {}
    for seq in args.seqs:
        for _ in range(args.repeats):
            for case, backward, arms in plans:
                for arm in arms:
                    key = (seq, case, backward, arm)
                    results.setdefault(key, []).append(measure(arm, case, seq, args.steps, backward))
    print(f"{'seq':>5}  {'case':<22} {'arm':<16} {'step ms':>9} {'peak MB':>9} {'x old ms':>9} {'x old MB':>9}")
    for seq in args.seqs:
        for case, backward, arms in plans:
            label = f"{case}{'' if backward else ', forward only'}"
            rows = {arm: results[(seq, case, backward, arm)] for arm in arms}
            ms = {arm: statistics.median(r["ms"] for r in rs) for arm, rs in rows.items()}
            mb = {arm: min(r["peak_mb"] for r in rs) for arm, rs in rows.items()}
            first = arms[0]
            for arm in arms:
                mb_ratio = f"{mb[arm] / mb[first]:.3f}" if mb[first] >= 1 else "-"
                print(f"{seq:>5}  {label:<22} {arm:<16} {ms[arm]:>9.1f} {mb[arm]:>9.1f} "
                      f"{ms[arm] / ms[first]:>9.2f} {mb_ratio:>9}")


if __name__ == "__main__":
    main()
