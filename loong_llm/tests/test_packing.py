"""Sequence packing: bins, block-diagonal causal masks, and packed logits == unpacked logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loong_core.kernels.segment_mask import segment_mask
from loong_core.testing import megatron_single_rank
from loong_llm.data.packing import block_causal_mask, pack, pack_best_fit, pack_next_fit, packed_sample


@pytest.fixture(scope="module")
def mcore_single_rank():
    """One-rank gloo group + megatron parallel state, with the cpu backend's patches."""
    with megatron_single_rank():
        yield


def tiny_llama(vocab_size: int = 96, num_layers: int = 2, mtp_num_layers=None):
    """A random-weight tiny Llama built the way the megatron engine builds it."""
    from loong_llm.families.llama.config import LlamaConfig
    from loong_llm.families.llama.model import LlamaProvider

    torch.manual_seed(0)
    provider = LlamaProvider(LlamaConfig(num_layers=num_layers, hidden_size=64, num_attention_heads=4,
                                         num_query_groups=2, ffn_hidden_size=128, vocab_size=vocab_size,
                                         max_position_embeddings=256, mtp_num_layers=mtp_num_layers))
    config = provider.megatron_config({})
    return provider.build_megatron_model(config, pre_process=True, post_process=True, vp_stage=None).eval()


def test_next_fit_keeps_order_and_capacity():
    bins = pack_next_fit([5, 3, 4, 8, 1, 1], capacity=8)
    assert bins == [[0, 1], [2], [3], [4, 5]]
    with pytest.raises(ValueError, match="item 1 needs 9"):
        pack_next_fit([1, 9], capacity=8)


def test_best_fit_places_largest_first_into_the_fullest_bin_with_room():
    # Largest first: 8 alone, then 5 opens a bin, 4 opens one (5 + 4 > 8), 3 joins the 5 (full),
    # 2 joins the 4 (fullest with room), 1 joins the 4 + 2 (the only bin with room).
    bins = pack_best_fit([3, 5, 1, 8, 4, 2], capacity=8)
    assert sorted(bins) == [[0, 1], [2, 4, 5], [3]]
    assert bins == [[0, 1], [2, 4, 5], [3]]  # each bin in input order, bins by their first item
    assert pack_next_fit([3, 5, 1, 8, 4, 2], capacity=8) == [[0, 1], [2], [3], [4, 5]]
    with pytest.raises(ValueError, match="item 1 needs 9"):
        pack_best_fit([1, 9], capacity=8)
    with pytest.raises(ValueError, match="choose one of best_fit, next_fit"):
        pack([1], 8, "first_fit")


def test_best_fit_packs_every_item_once_within_capacity_and_fills_more_than_next_fit():
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 700, 5000).tolist()
    for window in (1024, 64):
        bins = pack_best_fit(sizes, capacity=1024, window=window)
        assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
        assert max(sum(sizes[i] for i in b) for b in bins) <= 1024
        # windows never mix: every bin's items lie in one window
        assert all(b[0] // window == b[-1] // window for b in bins)
    best = len(pack_best_fit(sizes, 1024))
    lower_bound = -(-sum(sizes) // 1024)
    assert best <= 1.02 * lower_bound < 0.9 * len(pack_next_fit(sizes, 1024))


def test_best_fit_bins_come_in_a_random_order_when_given_a_generator():
    # Ordered by their first item, bins of many small items come first (they are more likely
    # to hold an early item); a generator draws the order instead, and keeps each window's bins.
    sizes = np.random.default_rng(0).integers(36, 311, 160).tolist()
    early, overall, drawn = [], [], []
    for epoch in range(300):
        order = np.random.default_rng(epoch).permutation(len(sizes))
        shuffled = [sizes[j] for j in order]
        by_first = pack_best_fit(shuffled, 1024)
        early.append(np.mean([len(b) for b in by_first[:3]]))
        overall.append(np.mean([len(b) for b in by_first]))
        rng = np.random.default_rng([1, epoch])
        bins = pack(shuffled, 1024, "best_fit", rng)
        assert sorted(map(tuple, bins)) == sorted(map(tuple, by_first))  # the same bins, reordered
        drawn.append(np.mean([len(b) for b in bins[:3]]))
    assert np.mean(early) > np.mean(overall) + 0.8
    assert abs(np.mean(drawn) - np.mean(overall)) < 0.25
    assert pack([3, 5, 1], 8, "next_fit", np.random.default_rng(0)) == pack_next_fit([3, 5, 1], 8)


def test_block_causal_mask_never_crosses_documents():
    mask = block_causal_mask([2, 3], seq_length=6)[0]  # True = masked
    allowed = (~mask).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],  # padding is its own block
    ]


def test_packed_sample_shifts_labels_and_restarts_positions():
    docs = [(np.array([10, 11, 12]), np.array([0, 1, 1])), (np.array([20, 21]), np.array([0, 1]))]
    s = packed_sample(docs, seq_length=5, pad_id=0)
    assert s["tokens"].tolist() == [10, 11, 20, 0, 0]
    assert s["labels"].tolist() == [11, 12, 21, 0, 0]
    assert s["loss_mask"].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert s["position_ids"].tolist() == [0, 1, 0, 0, 1]
    assert s["segment_ids"].tolist() == [0, 0, 1, 2, 2]  # padding is one more segment
    assert "attention_mask" not in s  # no [s, s] mask: the seam's attention reads the ids


def test_packed_logits_equal_unpacked(mcore_single_rank):
    model = tiny_llama()
    rng = np.random.default_rng(0)
    lengths = [9, 17, 5, 12]
    docs = [rng.integers(1, 96, size=n + 1) for n in lengths]  # n positions each
    seq = 48
    sample = packed_sample([(d, np.ones_like(d)) for d in docs], seq_length=seq, pad_id=0)
    with torch.no_grad():
        packed = model(sample["tokens"][None], sample["position_ids"][None],
                       segment_mask(sample["segment_ids"][None]))[0]  # [s, vocab]
        start, worst = 0, 0.0
        for d, n in zip(docs, lengths):
            tokens = torch.as_tensor(d[:-1], dtype=torch.long)[None]
            alone = model(tokens, torch.arange(n)[None], None)[0]
            worst = max(worst, (packed[start: start + n] - alone).abs().max().item())
            start += n
    print(f"packed vs unpacked logits: max abs diff {worst:.3e}")
    assert worst < 1e-4
    # Without the block mask the second document attends to the first: the logits differ.
    with torch.no_grad():
        leaky = model(sample["tokens"][None], sample["position_ids"][None], None)[0]
    assert (leaky[lengths[0]: sum(lengths[:2])] - packed[lengths[0]: sum(lengths[:2])]).abs().max() > 1e-2


def test_packed_mtp_loss_equals_the_documents_alone(mcore_single_rank):
    """Multi-token prediction on a packed sample: no depth predicts across a document border, so
    the MTP loss sum and token count are those of the documents run one by one."""
    model = tiny_llama(mtp_num_layers=2).train()
    rng = np.random.default_rng(1)
    lengths = [9, 17, 5]
    docs = [rng.integers(1, 96, size=n + 1) for n in lengths]
    sample = packed_sample([(d, np.ones_like(d)) for d in docs], seq_length=40, pad_id=0)
    with torch.no_grad():
        model(sample["tokens"][None], sample["position_ids"][None],
              segment_mask(sample["segment_ids"][None]), labels=sample["labels"][None],
              loss_mask=sample["loss_mask"][None])
        packed = model.mtp_last_loss.clone()
        alone = torch.zeros(2)
        for d, n in zip(docs, lengths):
            tokens, labels = (torch.as_tensor(x, dtype=torch.long)[None] for x in (d[:-1], d[1:]))
            model(tokens, torch.arange(n)[None], None, labels=labels, loss_mask=torch.ones(1, n))
            alone += model.mtp_last_loss
    # depth k of a document of n positions predicts n - 1 - k of its tokens
    assert packed[1].item() == alone[1].item() == sum(2 * n - 3 for n in lengths)
    torch.testing.assert_close(packed[0], alone[0], rtol=1e-5, atol=0)
