"""K/V exchange of context-parallel attention: all-gather (loong's) against a ring, attention alone.

Two gloo ranks (1 thread each) in megatron-core's load-balanced layout (rank ``r`` holds chunks
``r`` and ``2N-1-r``), llama_debug's attention shape (4 query heads, 2 K/V groups, head size 16),
fp32, forward + backward of a causal sequence:

- ``allgather``: ``loong_core.engines.megatron.seam.context_parallel.attention`` (all-gather K/V,
  one attention call per local query chunk against its key prefix; reduce-scatter of dK / dV).
- ``ring``: written here for the comparison: each of the ``N`` steps sends this rank's current
  K/V block to the next rank (``isend`` / ``irecv``, overlapped with the block's attention),
  computes every allowed (query chunk, key chunk) pair through the CPU flash kernel and merges the
  partial outputs by log-sum-exp; the backward runs the same ring with the merged output /
  log-sum-exp and sends the dK / dV of each block along with it, so they arrive at its owner.

Columns: median milliseconds of forward + backward over ``--repeats`` calls, peak RSS above the
process's footprint after setup (``ru_maxrss``, so each arm and length runs in its own pair of
processes, arms interleaved), and the largest difference between the two arms' outputs and
gradients (``ring`` only). The machine is shared: read the times as rough.

Usage: python benchmarks/cp_attention.py [--seqs 8192 32768] [--repeats 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from loong_core.testing import free_port

WORKER = r"""
import json, os, resource, statistics, sys, time
import torch
import torch.distributed as dist

torch.set_num_threads(1)
arm, seq, repeats, rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
group = dist.group.WORLD
sys.path.insert(0, os.environ["BENCH_DIR"])
from cp_attention import ring_attention
from loong_core.engines.megatron.seam import context_parallel

size = group.size()
heads, groups, d = 4, 2, 16
local = seq // size
g = torch.Generator().manual_seed(rank)
q = torch.randn(local, 1, heads, d, generator=g, requires_grad=True)
k = torch.randn(local, 1, groups, d, generator=g, requires_grad=True)
v = torch.randn(local, 1, groups, d, generator=g, requires_grad=True)
grad = torch.randn(local, 1, heads, d, generator=g)
fn = ring_attention if arm == "ring" else context_parallel.attention


def step():
    out = fn(q, k, v, group, causal=True, scale=d ** -0.5)
    out.backward(grad)
    return out


dist.barrier()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times = []
for _ in range(repeats):
    for t in (q, k, v):
        t.grad = None
    dist.barrier()
    start = time.perf_counter()
    out = step()
    times.append(time.perf_counter() - start)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
diff = 0.0
if arm == "ring":  # the same inputs through all-gather
    mine = [out.detach()] + [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = context_parallel.attention(q, k, v, group, causal=True, scale=d ** -0.5)
    ref.backward(grad)
    diff = max((a - b).abs().max().item() for a, b in zip(mine, [ref.detach()] + [t.grad for t in (q, k, v)]))
dist.destroy_process_group()
print(json.dumps({"ms": statistics.median(times) * 1e3, "peak_mib": peak / 1024, "diff": diff}), flush=True)
os._exit(0)
"""


def _pair_blocks(rank: int, size: int, source: int) -> list[tuple[int, int, int, int, bool]]:
    """The ``(local query half, query chunk, key half, key chunk, causal)`` pairs this rank
    computes with the K/V block of rank ``source`` (chunk ``i`` sees chunks ``j <= i``)."""
    from loong_core.engines.megatron.seam.context_parallel import local_chunks

    pairs = []
    for qh, qc in enumerate(local_chunks(size, rank)):
        for kh, kc in enumerate(local_chunks(size, source)):
            if kc <= qc:
                pairs.append((qh, qc, kh, kc, kc == qc))
    return pairs


def _exchange(tensors, group, send_to: int, recv_from: int):
    """Start sending ``tensors`` to ``send_to`` and receiving as many from ``recv_from``."""
    import torch.distributed as dist

    received = [t.new_empty(t.shape) for t in tensors]
    ranks = dist.get_process_group_ranks(group)
    works = [dist.isend(t.contiguous(), ranks[send_to], group=group) for t in tensors]
    works += [dist.irecv(t, ranks[recv_from], group=group) for t in received]
    return received, works


def _ring_function():
    import torch

    forward_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    backward_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

    class RingAttention(torch.autograd.Function):
        """``q, k, v [b, h|g, 2c, d]`` (this rank's two chunks); causal over the whole sequence."""

        @staticmethod
        def forward(ctx, q, k, v, group, scale):
            size, rank = group.size(), group.rank()
            c = q.shape[2] // 2
            out = torch.zeros(q.shape, dtype=torch.float32)
            lse = torch.full(q.shape[:3], float("-inf"))
            block_k, block_v = k, v
            for step in range(size):
                works = []
                if step < size - 1:
                    (next_k, next_v), works = _exchange((block_k, block_v), group, (rank + 1) % size,
                                                        (rank - 1) % size)
                source = (rank - step) % size
                for qh, _, kh, _, causal in _pair_blocks(rank, size, source):
                    rows = slice(qh * c, (qh + 1) * c)
                    part, part_lse = forward_op(q[:, :, rows], block_k[:, :, kh * c:(kh + 1) * c],
                                                block_v[:, :, kh * c:(kh + 1) * c], 0.0, causal,
                                                scale=scale)
                    merged = torch.logaddexp(lse[:, :, rows], part_lse)
                    out[:, :, rows] = (out[:, :, rows] * torch.exp(lse[:, :, rows] - merged).unsqueeze(-1)
                                       + part * torch.exp(part_lse - merged).unsqueeze(-1))
                    lse[:, :, rows] = merged
                for work in works:
                    work.wait()
                if step < size - 1:
                    block_k, block_v = next_k, next_v
            out = out.to(q.dtype)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.group, ctx.scale = group, scale
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, out, lse = ctx.saved_tensors
            group, scale = ctx.group, ctx.scale
            size, rank = group.size(), group.rank()
            c = q.shape[2] // 2
            grad_out = grad_out.contiguous()
            dq = torch.zeros_like(q)
            block_k, block_v = k, v
            block_dk, block_dv = torch.zeros_like(k), torch.zeros_like(v)
            for step in range(size):
                source = (rank - step) % size
                for qh, _, kh, _, causal in _pair_blocks(rank, size, source):
                    rows, cols = slice(qh * c, (qh + 1) * c), slice(kh * c, (kh + 1) * c)
                    gq, gk, gv = backward_op(grad_out[:, :, rows], q[:, :, rows], block_k[:, :, cols],
                                             block_v[:, :, cols], out[:, :, rows], lse[:, :, rows],
                                             0.0, causal, scale=scale)
                    dq[:, :, rows] += gq
                    block_dk[:, :, cols] += gk
                    block_dv[:, :, cols] += gv
                # The block and its gradient so far move on; after N moves the gradient is home
                # (the last move carries only dK / dV: K / V are home already).
                to, frm = (rank + 1) % size, (rank - 1) % size
                if step < size - 1:
                    (block_k, block_v, block_dk, block_dv), works = _exchange(
                        (block_k, block_v, block_dk, block_dv), group, to, frm)
                else:
                    (block_dk, block_dv), works = _exchange((block_dk, block_dv), group, to, frm)
                for work in works:
                    work.wait()
            return dq, block_dk, block_dv, None, None

    return RingAttention


def ring_attention(query, key, value, group, *, causal: bool = True, scale=None):
    """Ring-exchange CP attention with the signature of the seam's all-gather one (causal only)."""
    assert causal
    ring = _ring_function()
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
    return ring.apply(q, k, v, group, scale).permute(2, 0, 1, 3)


def _run_pair(arm: str, seq: int, repeats: int) -> dict:
    import os

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOONG_DEVICE": "cpu",
           "BENCH_DIR": os.path.dirname(os.path.abspath(__file__))}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, arm, str(seq), str(repeats), str(r), str(port)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"{arm} seq {seq} failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return {"ms": max(r["ms"] for r in results), "peak_mib": max(r["peak_mib"] for r in results),
            "diff": max(r["diff"] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="fresh process pairs per arm, interleaved")
    args = parser.parse_args()
    print("| seq | arm | fwd+bwd ms (median) | peak MiB above setup | max diff vs allgather |")
    print("|---|---|---|---|---|")
    for seq in args.seqs:
        runs: dict[str, list[dict]] = {"allgather": [], "ring": []}
        for _ in range(args.rounds):
            for arm in runs:
                runs[arm].append(_run_pair(arm, seq, args.repeats))
        for arm, results in runs.items():
            ms = statistics.median(r["ms"] for r in results)
            peak = max(r["peak_mib"] for r in results)
            diff = f"{max(r['diff'] for r in results):.1e}" if arm == "ring" else "-"
            print(f"| {seq} | {arm} | {ms:.0f} | {peak:.0f} | {diff} |", flush=True)


if __name__ == "__main__":
    main()
