"""cross_entropy:triton and the two linear cross entropies equal the torch reference (one rank)."""

from __future__ import annotations

import pytest
import torch

from loong_core.kernels import reference
from loong_core.testing import largest_tensor_seen
from loong_kernels import tiled_linear_ce
from loong_kernels.chunked import tiles as torch_tiles
from loong_kernels.chunked.linear_cross_entropy import linear_cross_entropy as chunked_lce
from loong_kernels.testing import check
from loong_kernels.triton import cross_entropy as triton_tiles
from loong_kernels.triton.cross_entropy import cross_entropy
from loong_kernels.triton.linear_cross_entropy import linear_cross_entropy as triton_lce

DTYPES = [torch.float32, torch.bfloat16]
TILES = {"triton": triton_tiles, "chunked": torch_tiles}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_matches_reference(dtype, smoothing):
    logits = (3 * torch.randn(2, 3, 2500)).to(dtype)  # vocab: one full 2048 block and a partial one
    labels = torch.randint(0, 2500, (2, 3))
    check(lambda z: cross_entropy(z, labels, smoothing), lambda z: reference.cross_entropy(z, labels, smoothing),
          [logits], dtype, f"cross_entropy {dtype} smoothing={smoothing}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tiles", list(TILES))
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_linear_cross_entropy_tiles_match_reference(dtype, tiles, smoothing):
    """13 tokens x 101 vocab in 4 x 17 tiles: neither divides evenly."""
    hidden, weight = torch.randn(13, 24, dtype=dtype), (0.3 * torch.randn(101, 24)).to(dtype)
    labels = torch.randint(0, 101, (13,))
    check(lambda h, w: tiled_linear_ce.linear_cross_entropy(h, w, labels, smoothing, None, TILES[tiles], 4, 17),
          lambda h, w: reference.linear_cross_entropy(h, w, labels, smoothing), [hidden, weight], dtype,
          f"linear_cross_entropy {tiles} {dtype} smoothing={smoothing}")


@pytest.mark.parametrize("fn", [triton_lce, chunked_lce], ids=["triton", "chunked"])
def test_linear_cross_entropy_registered_functions_match_reference(fn):
    hidden, weight, labels = torch.randn(20, 16), torch.randn(300, 16), torch.randint(0, 300, (20,))
    check(lambda h, w: fn(h, w, labels), lambda h, w: reference.linear_cross_entropy(h, w, labels),
          [hidden, weight], torch.float32, "linear_cross_entropy")


@pytest.mark.parametrize("tiles", list(TILES))
def test_linear_cross_entropy_tied_embedding_gradient(tiles):
    """The output layer is the embedding: both uses' gradients add up in one weight."""
    grads = []
    ids, labels = torch.randint(0, 50, (9,)), torch.randint(0, 50, (9,))
    for use_tiles in (True, False):
        torch.manual_seed(1)
        emb = torch.nn.Embedding(50, 12)
        proj = torch.nn.Linear(12, 12)
        hidden = torch.tanh(proj(emb(ids)))
        if use_tiles:
            loss = tiled_linear_ce.linear_cross_entropy(hidden, emb.weight, labels, 0.0, None, TILES[tiles], 4, 16)
        else:
            loss = reference.linear_cross_entropy(hidden, emb.weight, labels)
        loss.mean().backward()
        grads.append((emb.weight.grad, proj.weight.grad))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_linear_cross_entropy_never_makes_the_full_logits():
    """Every tensor the tiled loss creates, forward and backward, is at most a gradient or a tile.

    (Checked with the torch tiles: Triton's interpreter makes host copies of its own; the tiling is
    the same driver for both backends.)"""
    n, v, h = 64, 200, 8
    hidden = torch.randn(n, h, requires_grad=True)
    weight = torch.randn(v, h, requires_grad=True)
    labels = torch.randint(0, v, (n,))
    with largest_tensor_seen() as seen:
        tiled_linear_ce.linear_cross_entropy(hidden, weight, labels, 0.1, None, torch_tiles, 16, 32).sum().backward()
    # the largest: the weight gradient (v x h = 1600); a tile is 16 x 32 = 512; the logits 12800
    assert seen.numel == v * h
    with largest_tensor_seen() as seen:
        reference.linear_cross_entropy(hidden, weight, labels, 0.1).sum().backward()
    assert seen.numel == n * v
