"""The chunked schedule's pieces (``parallel.sequence_chunks``): its config rules, and chunked
attention (forward, then backward in reverse chunk order) against one causal attention over the
whole sequence, on one rank (with and without reentrant recompute) and on two gloo ranks under
context parallelism."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from loong_core.config.sequence_chunks_rules import check_sequence_chunks
from loong_core.engines.megatron import sequence_chunks
from loong_core.engines.megatron.seam import chunked_attention
from loong_core.errors import ConfigError
from loong_core.testing import run_gloo_workers


def _cfg(k, seq=256, cp=1, tp=1, sp=False, pp=1, engine="megatron", overlap=False):
    parallel = SimpleNamespace(sequence_chunks=k, context_parallel_size=cp, tensor_model_parallel_size=tp,
                               sequence_parallel=sp, pipeline_model_parallel_size=pp, engine=engine,
                               overlap_grad_reduce=overlap)
    return SimpleNamespace(parallel=parallel, data=SimpleNamespace(seq_length=seq))


def test_config_rules_name_the_key_and_the_nearest_valid_value():
    check_sequence_chunks(_cfg(4))
    check_sequence_chunks(_cfg(2, seq=256, cp=2))
    check_sequence_chunks(_cfg(5, seq=250))  # no multiple of 2 x CP needed without CP
    with pytest.raises(ConfigError, match=r"'data.seq_length' = 250 .* nearest valid length is 248 "
                                          r"\(or parallel.sequence_chunks=5"):
        check_sequence_chunks(_cfg(4, seq=250))
    with pytest.raises(ConfigError, match=r"2 x parallel.context_parallel_size = 4, per chunk\) = 8 .* nearest "
                                          r"valid length is 192 \(or parallel.sequence_chunks=1"):
        check_sequence_chunks(_cfg(2, seq=196, cp=2))
    with pytest.raises(ConfigError, match="pipeline parallelism"):
        check_sequence_chunks(_cfg(2, pp=2))
    with pytest.raises(ConfigError, match="overlap_grad_reduce=true is not tested yet"):
        check_sequence_chunks(_cfg(2, overlap=True))
    with pytest.raises(ConfigError, match="megatron engine"):
        check_sequence_chunks(_cfg(2, engine="torch"))


def _reference(q, k, v, segment_ids=None):
    """Causal attention of ``[s, b, h, d]`` tensors (GQA by repetition), fp64; with
    ``segment_ids [b, s]`` block-diagonal (packed documents)."""
    qq, kk, vv = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    rep = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)
    scores = (qq @ kk.transpose(-1, -2)) * qq.shape[-1] ** -0.5
    allowed = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).tril()
    if segment_ids is not None:
        allowed = allowed & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    return (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vv).permute(2, 0, 1, 3)


# Documents crossing chunk boundaries (chunks of 8): one spans chunks 0-2, one starts mid-chunk.
DOCS = torch.tensor([[0] * 5 + [1] * 14 + [2] * 5, [0] * 24])


@pytest.mark.parametrize("recompute, packed", [(False, False), (True, False), (True, True)])
def test_chunked_attention_equals_causal_attention_forward_and_backward(recompute, packed):
    torch.manual_seed(0)
    s, b, heads, groups, d, dv, k_chunks = 24, 2, 4, 2, 8, 6, 3  # GQA, v_channels != k_channels
    full = [torch.randn(s, b, n, c, dtype=torch.float64, requires_grad=True)
            for n, c in ((heads, d), (groups, d), (groups, dv))]
    weight = torch.randn(b, s, heads * dv, dtype=torch.float64)
    ids = DOCS if packed else None
    ref_in = [t.detach().clone().requires_grad_() for t in full]
    ref = _reference(*ref_in, ids)
    (ref.permute(1, 0, 2, 3).reshape(b, s, -1) * weight).sum().backward()

    layer = torch.nn.Module()
    size = s // k_chunks

    def attend(q, k, v):
        out = chunked_attention.attention(layer, q, k, v, scale=d ** -0.5)
        return out.permute(1, 0, 2, 3).reshape(b, q.shape[0], -1)

    def forward_chunk(chunk):
        if recompute:  # forward without a graph, recomputed in the chunk's backward
            return torch.utils.checkpoint.checkpoint(attend, *chunk, use_reentrant=True)
        return attend(*chunk)

    chunks = [[t[j * size:(j + 1) * size] for t in full] for j in range(k_chunks)]
    out = sequence_chunks.run(torch.nn.Module(), chunks, forward_chunk, segment_ids=ids)
    assert chunked_attention.active() is None
    (out * weight).sum().backward()
    assert (out - ref.permute(1, 0, 2, 3).reshape(b, s, -1)).abs().max() < 1e-12
    for mine, theirs in zip(full, ref_in):
        assert (mine.grad - theirs.grad).abs().max() < 1e-12


# Two ranks: two global chunks, each laid out over the CP group (rank r: pieces r and 3 - r of 4);
# causal, and packed documents.
WORKER = r"""
import json, os, sys
import torch
import torch.distributed as dist
from loong_core.engines.megatron import sequence_chunks
from loong_core.engines.megatron.seam import chunked_attention, context_parallel

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
torch.manual_seed(0)
s, b, heads, groups, d, k_chunks = 32, 1, 4, 2, 8, 2
full = [torch.randn(s, b, n, d, dtype=torch.float64, requires_grad=True) for n in (heads, groups, groups)]
weight = torch.randn(s, b, heads, d, dtype=torch.float64)
docs = torch.tensor([[0] * 5 + [1] * 20 + [2] * 7])  # documents across chunks and pieces
size, piece = s // k_chunks, s // k_chunks // 4
index = [torch.tensor([j * size + i for c in context_parallel.local_chunks(2, rank)
                       for i in range(c * piece, (c + 1) * piece)]) for j in range(k_chunks)]
mine = torch.cat(index)
errors = {}
for name, ids in (("causal", None), ("packed", docs)):
    allowed = torch.ones(s, s, dtype=torch.bool).tril()
    if ids is not None:
        allowed = allowed & (ids[0][:, None] == ids[0][None, :])
    qq, kk, vv = (t.permute(1, 2, 0, 3) for t in full)
    kk, vv = kk.repeat_interleave(2, 1), vv.repeat_interleave(2, 1)
    scores = (qq @ kk.transpose(-1, -2)) * d ** -0.5
    ref = (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vv).permute(2, 0, 1, 3)
    ref_grads = torch.autograd.grad((ref * weight).sum(), full)
    layer = torch.nn.Module()

    def forward_chunk(chunk):
        out = chunked_attention.attention(layer, *chunk, cp_group=dist.group.WORLD, scale=d ** -0.5)
        return out.transpose(0, 1)  # [b, 2 pieces, heads, d]

    # The chunks' backwards accumulate into .grad (run's output has no graph to the inputs, so
    # torch.autograd.grad cannot follow it; megatron-core's schedules call backward).
    leaves = [t.detach().clone().requires_grad_() for t in full]
    local = [[t[i] for t in leaves] for i in index]
    out = sequence_chunks.run(torch.nn.Module(), local, forward_chunk, segment_ids=ids)
    (out * weight[mine].transpose(0, 1)).sum().backward()
    grads = [t.grad for t in leaves]
    errs = [(out.transpose(0, 1) - ref[mine]).abs().max().item()]
    errors[name] = max(errs + [(g[mine] - r[mine]).abs().max().item() for g, r in zip(grads, ref_grads)])
dist.destroy_process_group()
print(json.dumps(errors), flush=True)
os._exit(0)
"""


@pytest.mark.multirank
def test_chunked_attention_under_context_parallelism_equals_one_rank():
    for errors in run_gloo_workers(WORKER):
        assert set(errors) == {"causal", "packed"}
        assert max(errors.values()) < 1e-12, errors
