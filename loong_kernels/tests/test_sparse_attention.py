"""sparse_attention:triton and indexer_topk:triton equal the torch references (DeepSeek sparse
attention), forward and backward, in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from loong_core.kernels import reference
from loong_kernels.testing import check
from loong_kernels.triton.indexer_topk import indexer_topk
from loong_kernels.triton.sparse_attention import sparse_attention

S, B, H = 21, 2, 2  # odd length: partial key blocks and query tiles


def _selection(topk: int) -> torch.Tensor:
    """Distinct keys per query, the query itself first, later (ignored) keys among the rest."""
    rows = []
    for i in range(S):
        others = [j for j in torch.randperm(S).tolist() if j != i][: topk - 1]
        rows.append([i, *others])
    return torch.tensor(rows).expand(B, S, topk).contiguous()


@pytest.mark.parametrize("topk, dq, dv", [(7, 12, 5), (S, 16, 16)])  # sparse; dense causal
def test_sparse_attention_matches_reference(topk, dq, dv):
    q, k = torch.randn(S, B, H, dq), torch.randn(S, B, H, dq)
    v = torch.randn(S, B, H, dv)
    idx = _selection(topk) if topk < S else torch.arange(S).expand(B, S, S)

    def fn(impl):
        return lambda q, k, v: impl(q, k, v, idx, dq ** -0.5)

    check(fn(sparse_attention), fn(reference.sparse_attention), [q, k, v], torch.float32,
          f"sparse_attention topk={topk}")


def test_sparse_attention_bf16_within_bf16_rounding():
    q, k, v = (torch.randn(S, B, H, 16, dtype=torch.bfloat16) for _ in range(3))
    idx = _selection(9)
    check(lambda q, k, v: sparse_attention(q, k, v, idx, 0.25),
          lambda q, k, v: reference.sparse_attention(q, k, v, idx, 0.25), [q, k, v],
          torch.bfloat16, "sparse_attention bf16")


@pytest.mark.parametrize("topk", [5, 40])  # fewer keys than the sequence; more (dense)
def test_indexer_topk_picks_the_reference_keys(topk):
    q, k, w = torch.randn(S, B, 3, 16), torch.randn(S, B, 16), torch.randn(S, B, 3)
    got, want = indexer_topk(q, k, w, topk), reference.indexer_topk(q, k, w, topk)
    assert got.shape == want.shape == (B, S, min(topk, S))
    valid = want <= torch.arange(S).view(1, -1, 1)  # the rest of a short prefix's row: any key
    assert torch.equal(got <= torch.arange(S).view(1, -1, 1), valid)
    # keys of equal score (relu zeros) may come in either order: compare the selected scores
    from loong_core.kernels.sparse_attention import indexer_scores

    scores = indexer_scores(q, k, w)
    torch.testing.assert_close(scores.gather(-1, got)[valid], scores.gather(-1, want)[valid])
