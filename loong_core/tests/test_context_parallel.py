"""Context parallelism pieces: the sequence-length rule, the chunk layout, and the all-gather
attention (forward and backward) of two gloo ranks against one-rank attention."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loong_core.engines.megatron.context_parallel import check_seq_length, sequence_multiple
from loong_core.engines.megatron.seam.context_parallel import chunk_order, local_chunks
from loong_core.errors import ConfigError
from loong_core.testing import run_gloo_workers


def _parallel(cp, tp=1, sp=False):
    return SimpleNamespace(context_parallel_size=cp, tensor_model_parallel_size=tp,
                           sequence_parallel=sp)


def test_seq_length_must_split_into_two_chunks_per_rank():
    check_seq_length(256, _parallel(2))
    check_seq_length(250, _parallel(1))
    assert sequence_multiple(_parallel(2, tp=2, sp=True)) == 8
    with pytest.raises(ConfigError, match=r"'data.seq_length' = 250 .* nearest valid length is 248"):
        check_seq_length(250, _parallel(4))
    with pytest.raises(ConfigError, match="nearest valid length is 256"):
        check_seq_length(255, _parallel(2))
    with pytest.raises(ConfigError, match="tensor_model_parallel_size = 2 .* nearest valid length is 8"):
        check_seq_length(6, _parallel(2, tp=2, sp=True))


def test_load_balanced_layout():
    # CP2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2; the gather is [0, 3, 1, 2].
    assert [local_chunks(2, r) for r in range(2)] == [(0, 3), (1, 2)]
    assert chunk_order(2) == [0, 2, 3, 1]
    gathered = [c for r in range(4) for c in local_chunks(4, r)]
    assert [gathered[i] for i in chunk_order(4)] == list(range(8))


# Two ranks of a gloo group, each with its load-balanced chunks, against one-rank attention.
WORKER = r"""
import json, os, sys
import torch
import torch.distributed as dist
from loong_core.engines.megatron.seam import context_parallel

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)


def reference(q, k, v, allowed):
    qq, kk, vv = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    rep = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)
    scores = (qq @ kk.transpose(-1, -2)) * qq.shape[-1] ** -0.5
    return (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vv).permute(2, 0, 1, 3)


torch.manual_seed(0)
s, b, heads, groups, d, dv = 16, 2, 4, 2, 8, 6  # GQA, and v_channels != k_channels as in MLA
q = torch.randn(s, b, heads, d, dtype=torch.float64)
k = torch.randn(s, b, groups, d, dtype=torch.float64)
v = torch.randn(s, b, groups, dv, dtype=torch.float64)
grad_out = torch.randn(s, b, heads, dv, dtype=torch.float64)
causal = torch.ones(s, s, dtype=torch.bool).tril()
docs = torch.tensor([0] * 5 + [1] * 7 + [2] * 4)  # document boundaries inside chunks
packed = causal & (docs[:, None] == docs[None, :])
chunk = s // 4
mine = [i for c in context_parallel.local_chunks(2, rank) for i in range(c * chunk, (c + 1) * chunk)]
errors = {}
# Packed: the segment ids of the whole sequence, as the providers pass them (no [s, s] mask).
for name, allowed, ids in (("causal", causal, None), ("packed", packed, docs[None])):
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference(*full, allowed).backward(grad_out)
    ref = reference(q, k, v, allowed)
    local = [t[mine].clone().requires_grad_() for t in (q, k, v)]
    out = context_parallel.attention(*local, dist.group.WORLD, causal=True, segment_ids=ids,
                                     scale=d ** -0.5)
    out.backward(grad_out[mine])
    errors[name] = max([(out - ref[mine]).abs().max().item()]
                       + [(a.grad - f.grad[mine]).abs().max().item() for a, f in zip(local, full)])
dist.destroy_process_group()
print(json.dumps(errors), flush=True)
os._exit(0)  # skip interpreter teardown: gloo's threads can abort it ("terminate called"), seen once in CI
"""


@pytest.mark.multirank
def test_all_gather_attention_equals_one_rank_forward_and_backward():
    for errors in run_gloo_workers(WORKER):
        assert set(errors) == {"causal", "packed"}
        for name, value in errors.items():
            assert value < 1e-12, (name, value)
