"""DeepSeek sparse attention vs dense attention: time and peak memory of one forward + backward.

Arms (each length and arm in a fresh process, so peak RSS is the arm's own):
- ``dense-eager``: causal attention with the ``[h, s, s]`` scores materialised (megatron-core's
  unfused core attention); skipped where those scores alone would exceed ``--max-gb``.
- ``dense-sdpa``: torch's ``scaled_dot_product_attention(is_causal=True)`` (flash-style on CPU).
- ``dsa-torch``: loong's DSA path: the lightning indexer's chunked top-k, then attention over the
  selected keys (``loong_llm.families.deepseek_v32``), forward + backward.
Shapes: batch 1, MLA-like heads (``--heads`` x q/k 96, v 64), indexer 4 heads x 64, top-k 2048.
Peak memory is the growth of the process's peak RSS over the inputs, in MiB.

Usage: python benchmarks/dsa.py [--lengths 4096 8192 16384 32768] [--topk 2048] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

ARMS = ("dense-eager", "dense-sdpa", "dsa-torch")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_arm(arm: str, seq: int, heads: int, topk: int, repeats: int) -> dict:
    """One arm at one length in this process: best seconds and peak-RSS growth."""
    import torch

    torch.manual_seed(0)
    q, k = (torch.randn(seq, 1, heads, 96, requires_grad=True) for _ in range(2))
    v = torch.randn(seq, 1, heads, 64, requires_grad=True)
    x, qr = torch.randn(seq, 1, 256), torch.randn(seq, 1, 128)
    scale = 96 ** -0.5
    if arm == "dsa-torch":
        from loong_llm.families.deepseek_v32.indexer import LightningIndexer
        from loong_llm.families.deepseek_v32.sparse_attention import sparse_attention

        indexer = LightningIndexer(256, 128, 4, 64, 32, 1.0 / (10000 ** (torch.arange(0, 32, 2) / 32)))

        def step():
            with torch.no_grad():
                iq, ik, iw = indexer.project(x, qr)
            idx = indexer.topk(iq, ik, iw, topk)
            return sparse_attention(q, k, v, idx, scale)
    elif arm == "dense-sdpa":
        def step():
            out = torch.nn.functional.scaled_dot_product_attention(
                q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3),
                is_causal=True, scale=scale)
            return out.permute(2, 0, 1, 3)
    else:
        def step():
            scores = torch.einsum("sbhd,tbhd->bhst", q, k) * scale
            scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
            return torch.einsum("bhst,tbhd->sbhd", torch.softmax(scores, dim=-1), v)
    base = _rss_mib()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step().sum().backward()
        best = min(best, time.perf_counter() - start)
        q.grad = k.grad = v.grad = None
    return {"seconds": best, "peak_mib": _rss_mib() - base}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-gb", type=float, default=8.0, help="skip dense-eager above this")
    p.add_argument("--arm", help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.arm:  # a child: one measurement, printed as JSON
        print(json.dumps(run_arm(args.arm, args.seq, args.heads, args.topk, args.repeats)))
        return 0
    print(f"{'seq':>6} | {'arm':<11} | {'s (fwd+bwd)':>11} | {'peak MiB':>9} | vs dense-eager mem")
    for seq in args.lengths:
        eager_mib = None
        for arm in ARMS:
            scores_gb = 3 * args.heads * seq * seq * 4 / 1e9  # scores, probs and their grad
            if arm == "dense-eager" and scores_gb > args.max_gb:
                print(f"{seq:>6} | {arm:<11} | {'skipped':>11} | {f'~{scores_gb:.0f} GB':>9} |")
                eager_mib = scores_gb * 1e9 / 2 ** 20
                continue
            out = subprocess.run([sys.executable, __file__, "--arm", arm, "--seq", str(seq),
                                  "--topk", str(args.topk), "--heads", str(args.heads),
                                  "--repeats", str(args.repeats)], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{seq:>6} | {arm:<11} | failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            if arm == "dense-eager":
                eager_mib = r["peak_mib"]
            ratio = f"{r['peak_mib'] / eager_mib:.2f}x" if eager_mib else ""
            print(f"{seq:>6} | {arm:<11} | {r['seconds']:>11.2f} | {r['peak_mib']:>9.0f} | {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
