"""Worker of test_tensor_parallel.py: one of 2 ranks (gloo) with megatron-core's TP2 state.

Compares the vocab-parallel Triton cross entropy and both tiled linear cross entropies with
megatron-core's ``vocab_parallel_cross_entropy`` on this rank's vocab shard (loss, gradients), and
the TP2 loss with the whole-vocab reference. Rank 0 writes ``name -> max abs difference`` (the max
over ranks) as JSON to ``argv[1]``.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from loong_core.devices.select import select_device  # noqa: E402
from loong_core.kernels import reference  # noqa: E402

N, V_LOCAL, H = 11, 37, 8  # 37 vocab rows per rank: not a multiple of any tile


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _loss_and_grads(fn, inputs, cotangent):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    loss = fn(*leaves)
    loss.backward(cotangent)
    return loss.detach(), [leaf.grad for leaf in leaves]


def _compare(smoothing, group, logits, hidden, weight, labels, cotangent) -> dict[str, float]:
    """Differences of the kernels from megatron-core on this rank's shard at one label smoothing."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from loong_kernels import tiled_linear_ce
    from loong_kernels.chunked import tiles as torch_tiles
    from loong_kernels.triton import cross_entropy as triton_tiles

    def megatron(z):
        return vocab_parallel_cross_entropy(z.clone(), labels, smoothing)  # it edits fp32 logits in place

    diffs = {}
    want, (want_grad,) = _loss_and_grads(megatron, [logits], cotangent)
    got, (got_grad,) = _loss_and_grads(lambda z: triton_tiles.cross_entropy(z, labels, smoothing, group),
                                       [logits], cotangent)
    diffs[f"cross_entropy loss ls={smoothing}"] = _diff(got, want)
    diffs[f"cross_entropy grad ls={smoothing}"] = _diff(got_grad, want_grad)
    want, want_grads = _loss_and_grads(lambda h, w: megatron(h @ w.t()), [hidden, weight], cotangent)
    for name, tiles in (("triton", triton_tiles), ("chunked", torch_tiles)):
        got, got_grads = _loss_and_grads(
            lambda h, w, t=tiles: tiled_linear_ce.linear_cross_entropy(h, w, labels, smoothing, group, t, 4, 16),
            [hidden, weight], cotangent)
        diffs[f"linear_cross_entropy {name} loss ls={smoothing}"] = _diff(got, want)
        diffs[f"linear_cross_entropy {name} grad hidden ls={smoothing}"] = _diff(got_grads[0], want_grads[0])
        diffs[f"linear_cross_entropy {name} grad weight ls={smoothing}"] = _diff(got_grads[1], want_grads[1])
    return diffs


def main(out_path: str) -> None:
    select_device("cpu").setup()
    dist.init_process_group("gloo")
    from megatron.core import parallel_state as ps

    from loong_kernels.triton import cross_entropy as triton_tiles

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    group, rank = ps.get_tensor_model_parallel_group(), dist.get_rank()
    torch.manual_seed(0)  # same full tensors on both ranks
    logits = 3 * torch.randn(N, 2 * V_LOCAL)
    hidden, weight = torch.randn(N, H), 0.5 * torch.randn(2 * V_LOCAL, H)
    labels, cotangent = torch.randint(0, 2 * V_LOCAL, (N,)), torch.randn(N)
    shard = slice(rank * V_LOCAL, (rank + 1) * V_LOCAL)
    diffs = {}
    for smoothing in (0.0, 0.1):
        diffs.update(_compare(smoothing, group, logits[:, shard], hidden, weight[shard], labels, cotangent))
    whole = reference.cross_entropy(logits, labels)
    diffs["TP2 loss vs whole vocab"] = _diff(triton_tiles.cross_entropy(logits[:, shard], labels, 0.0, group), whole)
    values = torch.tensor(list(diffs.values()), dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(dict(zip(diffs, values.tolist())), f, indent=1)
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
