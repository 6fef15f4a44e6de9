"""DeepSeek sparse attention vs dense attention: time and peak memory of one forward + backward.

Arms (each length and arm in a fresh process, so peak RSS is the arm's own):
- ``dense-eager``: causal attention with the ``[h, s, s]`` scores materialised (megatron-core's
  unfused core attention); skipped where those scores alone would exceed ``--max-gb``.
- ``dense-sdpa``: torch's ``scaled_dot_product_attention(is_causal=True)``: flash attention on
  CUDA; on CPU, MLA's head widths (query/key 96 != value 64 here) send it to the math path,
  which holds the same scores as eager (measured: 12.4 against 12.6 GB at 16k), so it is skipped
  there by the same estimate.
- ``dsa-torch``: loong's DSA path with the torch references of the kernel seam's ops: the
  lightning indexer's chunked causal top-k (``indexer_topk:torch``), then attention over the
  selected keys (``sparse_attention:torch``), forward + backward.
- ``dsa-triton`` (``--device cuda`` only): the same with ``indexer_topk:triton`` and
  ``sparse_attention:triton`` (loong_kernels).
Shapes: batch 1, MLA-like heads (``--heads`` x q/k 96, v 64), indexer 4 heads x 64, top-k 2048.
Peak memory is the growth over the inputs of the process's peak RSS (CPU) or of
``torch.cuda.max_memory_allocated`` (GPU), in MiB.

Usage: python benchmarks/dsa.py [--lengths 4096 8192 16384 32768] [--topk 2048] [--repeats 2]
       [--device cuda] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

ARMS = ("dense-eager", "dense-sdpa", "dsa-torch", "dsa-triton")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_arm(arm: str, seq: int, heads: int, topk: int, repeats: int, device: str = "cpu",
            dtype: str = "fp32") -> dict:
    """One arm at one length in this process: best seconds and peak-memory growth (MiB)."""
    import torch

    dev, dt = torch.device(device), getattr(torch, DTYPES[dtype])
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    leaf = lambda *shape: torch.randn(*shape, device=dev, dtype=dt).requires_grad_()  # noqa: E731
    q, k, v = leaf(seq, 1, heads, 96), leaf(seq, 1, heads, 96), leaf(seq, 1, heads, 64)
    x, qr = torch.randn(seq, 1, 256, device=dev, dtype=dt), torch.randn(seq, 1, 128, device=dev, dtype=dt)
    scale = 96 ** -0.5
    if arm.startswith("dsa-"):
        from loong_llm.families.deepseek_v32.indexer import LightningIndexer

        if arm == "dsa-triton":
            from loong_kernels.triton.indexer_topk import indexer_topk
            from loong_kernels.triton.sparse_attention import sparse_attention
        else:
            from loong_core.kernels.sparse_attention import indexer_topk, sparse_attention
        inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2, device=dev) / 32))
        indexer = LightningIndexer(256, 128, 4, 64, 32, inv_freq).to(dev, dt)

        def step():
            with torch.no_grad():
                iq, ik, iw = indexer.project(x, qr)
            return sparse_attention(q, k, v, indexer_topk(iq, ik, iw, topk), scale)
    elif arm == "dense-sdpa":
        def step():
            out = torch.nn.functional.scaled_dot_product_attention(
                q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3),
                is_causal=True, scale=scale)
            return out.permute(2, 0, 1, 3)
    else:
        def step():
            scores = torch.einsum("sbhd,tbhd->bhst", q, k) * scale
            future = torch.ones(seq, seq, dtype=torch.bool, device=dev).triu(1)
            scores = scores.float().masked_fill(future, float("-inf"))
            return torch.einsum("bhst,tbhd->sbhd", torch.softmax(scores, dim=-1).to(dt), v)

    def peak_mib() -> float:
        return torch.cuda.max_memory_allocated(dev) / 2 ** 20 if cuda else _rss_mib()

    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    base = peak_mib()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step().float().sum().backward()
        if cuda:
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - start)
        q.grad = k.grad = v.grad = None
    return {"seconds": best, "peak_mib": peak_mib() - base}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-gb", type=float, default=8.0, help="skip dense-eager above this")
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda adds the dsa-triton arm)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--arms", nargs="+", choices=ARMS,
                   help="default: all (dsa-triton on cuda; on CPU only under TRITON_INTERPRET=1)")
    p.add_argument("--arm", help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.arm:  # a child: one measurement, printed as JSON
        print(json.dumps(run_arm(args.arm, args.seq, args.heads, args.topk, args.repeats,
                                 args.device, args.dtype)))
        return 0
    arms = args.arms or [a for a in ARMS if a != "dsa-triton" or args.device.startswith("cuda")]
    print(f"device {args.device}, {args.dtype}, batch 1, {args.heads} heads, top-k {args.topk}")
    print(f"{'seq':>6} | {'arm':<11} | {'s (fwd+bwd)':>11} | {'peak MiB':>9} | vs dense-eager mem")
    for seq in args.lengths:
        eager_mib, estimated = None, ""
        for arm in arms:
            scores_gb = 3 * args.heads * seq * seq * 4 / 1e9  # fp32 scores, probs and their grad
            # On CPU, SDPA's backward takes the math path, which holds the same [s, s] scores.
            materialises = arm == "dense-eager" or (arm == "dense-sdpa" and args.device == "cpu")
            if materialises and scores_gb > args.max_gb:
                print(f"{seq:>6} | {arm:<11} | {'skipped':>11} | {f'~{scores_gb:.0f} GB':>9} |")
                if arm == "dense-eager":
                    eager_mib, estimated = scores_gb * 1e9 / 2 ** 20, " (of the estimate)"
                continue
            out = subprocess.run([sys.executable, __file__, "--arm", arm, "--seq", str(seq),
                                  "--topk", str(args.topk), "--heads", str(args.heads),
                                  "--repeats", str(args.repeats), "--device", args.device,
                                  "--dtype", args.dtype], capture_output=True, text=True)
            if out.returncode != 0:
                why = out.stderr.strip().splitlines()[-1:] or [f"killed, exit {out.returncode} "
                                                               "(out of memory?)"]
                print(f"{seq:>6} | {arm:<11} | failed: {why[0]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            if arm == "dense-eager":
                eager_mib = r["peak_mib"]
            ratio = f"{r['peak_mib'] / eager_mib:.3f}x{estimated}" if eager_mib else ""
            print(f"{seq:>6} | {arm:<11} | {r['seconds']:>11.2f} | {r['peak_mib']:>9.0f} | {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
