"""DeepSeek sparse attention (the ``deepseek_v32`` family): attention over the indexer's top-k
keys equals dense attention masked to those keys, forward and backward, without ever holding an
``[s, s]`` matrix; top-k >= s is dense causal attention; the indexer's top-k and KL loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from loong_core.testing import largest_tensor_seen
from loong_llm.families.deepseek_v32.indexer import LightningIndexer
from loong_llm.families.deepseek_v32.sparse_attention import sparse_attention

S, B, H, D, DV = 24, 2, 3, 8, 5


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(S, B, H, d, generator=g, dtype=torch.float64).requires_grad_()
            for d in (D, D, DV)]


def _dense_reference(q, k, v, allowed, scale):
    """Masked dense attention; ``allowed [b, s, s]`` bool."""
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) * scale
    scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    return torch.einsum("bhst,tbhd->sbhd", torch.softmax(scores, dim=-1), v)


def _random_indices(topk, seed=1):
    """Distinct keys per query, the query itself among them, future keys too (ignored)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(B):
        for i in range(S):
            others = torch.tensor([j for j in torch.randperm(S, generator=g).tolist() if j != i])
            rows.append(torch.cat([torch.tensor([i]), others[: topk - 1]]))
    return torch.stack(rows).view(B, S, topk)


def test_sparse_attention_equals_masked_dense_forward_and_backward():
    q, k, v = _qkv()
    idx = _random_indices(7)
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    allowed = torch.zeros(B, S, S, dtype=torch.bool).scatter_(-1, idx, True) & causal
    scale = 1 / math.sqrt(D)
    got = sparse_attention(q, k, v, idx, scale)
    want = _dense_reference(q, k, v, allowed, scale)
    assert (got - want).abs().max() < 1e-12
    grad = torch.randn_like(got)
    got_grads = torch.autograd.grad(got, (q, k, v), grad)
    want_grads = torch.autograd.grad(want, (q, k, v), grad)
    for a, b in zip(got_grads, want_grads):
        assert (a - b).abs().max() < 1e-12


def test_topk_at_least_the_sequence_is_dense_causal_attention():
    q, k, v = _qkv(3)
    idx = torch.arange(S).expand(B, S, S)
    causal = torch.ones(S, S, dtype=torch.bool).tril().expand(B, S, S)
    got = sparse_attention(q, k, v, idx, 0.3)
    assert (got - _dense_reference(q, k, v, causal, 0.3)).abs().max() < 1e-12


def test_sparse_attention_never_holds_a_seq_by_seq_matrix():
    s, topk = 1024, 8
    q, k, v = (torch.randn(s, 1, 1, 4, requires_grad=True) for _ in range(3))
    idx = torch.randint(0, s, (1, s, topk))
    with largest_tensor_seen() as seen:
        sparse_attention(q, k, v, idx, 0.35).sum().backward()
    # the largest tensors are the gathered keys of a chunk, s * topk * h * d, not s * s
    assert seen.numel <= s * topk * 4, seen.numel


def _indexer(seed=0):
    torch.manual_seed(seed)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4))
    return LightningIndexer(hidden_size=16, q_lora_rank=8, n_heads=2, head_dim=8, rope_dim=4,
                            inv_freq=inv_freq, init_std=0.3)


def test_indexer_topk_is_the_causal_top_of_its_scores():
    indexer = _indexer()
    x, qr = torch.randn(S, B, 16), torch.randn(S, B, 8)
    q, k, w = indexer.project(x, qr)
    top = indexer.topk(q, k, w, 5)
    scores = LightningIndexer.scores(q, k, w)  # [b, s, s], the whole matrix (reference)
    scores = scores.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    valid = top <= torch.arange(S).view(1, -1, 1)  # early queries also list (ignored) later keys
    best = scores.topk(5, dim=-1).values  # ties (relu zeros) may pick either key: compare scores
    assert torch.equal(valid, best > float("-inf"))
    assert torch.allclose(scores.gather(-1, top)[valid], best[valid], atol=1e-6)
    selected = indexer.selected_scores(q, k, w, top)
    assert torch.allclose(selected[valid], scores.gather(-1, top)[valid], atol=1e-6)


@pytest.mark.parametrize("sparse_loss", [False, True])
def test_indexer_loss_trains_only_the_indexer_and_falls(sparse_loss):
    from types import SimpleNamespace

    from loong_llm.families.deepseek_v32.dsa_attention import DSACoreAttention

    config = SimpleNamespace(hidden_size=16, q_lora_rank=8, qk_pos_emb_head_dim=4, qk_head_dim=4,
                             init_method_std=0.3, sequence_parallel=False)
    torch.manual_seed(0)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4))
    attn = DSACoreAttention(config, 1, 8 ** -0.5, indexer_n_heads=2, indexer_head_dim=8, topk=6,
                            loss_coeff=1.0, sparse_loss=sparse_loss, dense_warmup=False,
                            inv_freq=inv_freq).train()
    q, k = torch.randn(S, B, H, 8), torch.randn(S, B, H, 8)
    v = torch.randn(S, B, H, DV, requires_grad=True)
    x, qr = torch.randn(S, B, 16, requires_grad=True), torch.randn(S, B, 8, requires_grad=True)
    optimizer = torch.optim.Adam(attn.indexer.parameters(), lr=3e-2)
    first = None
    for _ in range(30):
        optimizer.zero_grad()
        out = attn(q, k, v, None, x=x, qr=qr)
        out.sum().backward()
        first = first if first is not None else float(attn.last_loss)
        optimizer.step()
    assert x.grad is None and qr.grad is None  # the indexer reads detached inputs
    assert float(attn.last_loss) < 0.8 * first, (first, float(attn.last_loss))


@pytest.fixture(scope="module")
def tiny_deepseek_v32():
    """A random tiny DeepSeek-V3.2 (top-4 sparse attention, indexer loss on) on one rank."""
    from loong_core.testing import megatron_single_rank
    from loong_llm.families.deepseek_v32.config import DeepSeekV32Config
    from loong_llm.families.deepseek_v32.model import DeepSeekV32Provider

    with megatron_single_rank():
        torch.manual_seed(0)
        provider = DeepSeekV32Provider(DeepSeekV32Config(
            name="deepseek_v32", num_layers=2, hidden_size=64, num_attention_heads=4,
            ffn_hidden_size=96, vocab_size=96, max_position_embeddings=256, q_lora_rank=32,
            kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16, num_experts=4,
            moe_router_topk=2, moe_ffn_hidden_size=32, moe_layer_freq=[0, 1],
            dsa_indexer_n_heads=2, dsa_indexer_head_dim=16, dsa_indexer_topk=4,
            dsa_indexer_loss_coeff=1.0, init_method_std=0.1))
        config = provider.megatron_config({})
        yield provider.build_megatron_model(config, pre_process=True, post_process=True, vp_stage=None)


def test_packed_documents_equal_each_document_alone(tiny_deepseek_v32):
    """Each packed document selects its top-k among its own keys: its logits and its indexer
    loss terms are those of the document run alone; without the borders they differ."""
    from loong_core.kernels.segment_mask import segment_mask
    from loong_llm.data.packing import packed_sample
    from loong_llm.families.deepseek_v32.dsa_attention import DSACoreAttention

    model = tiny_deepseek_v32
    layers = [m for m in model.modules() if isinstance(m, DSACoreAttention)]
    rng = np.random.default_rng(0)
    lengths = [9, 17, 3, 12]  # one shorter than top-4: dense inside it
    docs = [rng.integers(1, 96, size=n + 1) for n in lengths]
    seq = sum(lengths)
    sample = packed_sample([(d, np.ones_like(d)) for d in docs], seq_length=seq, pad_id=0)
    model.train()
    with torch.no_grad(), torch.enable_grad():
        packed = model(sample["tokens"][None], sample["position_ids"][None],
                       segment_mask(sample["segment_ids"][None]))[0]
        packed_kl = sum(float(m.last_loss) for m in layers) * seq
        start, worst, alone_kl = 0, 0.0, 0.0
        for d, n in zip(docs, lengths):
            alone = model(torch.as_tensor(d[:-1], dtype=torch.long)[None], torch.arange(n)[None], None)[0]
            worst = max(worst, (packed[start: start + n] - alone).abs().max().item())
            alone_kl += sum(float(m.last_loss) for m in layers) * n
            start += n
        leaky = model(sample["tokens"][None], sample["position_ids"][None], None)[0]
    assert worst < 1e-4, worst
    assert packed_kl == pytest.approx(alone_kl, rel=1e-5) and packed_kl > 0
    second = slice(lengths[0], lengths[0] + lengths[1])
    assert (leaky[second] - packed[second]).abs().max() > 1e-2


def test_published_config_reads_as_the_671b_yaml():
    """transformers' DeepSeek-V3.2 defaults with the published YaRN extension (factor 40 of a 4k
    context) are the shape ``model=deepseek_v32_671b`` composes."""
    from pathlib import Path

    import transformers as tf
    import yaml

    import loong_llm
    from loong_llm.families.deepseek_v32.hf_adapter import DeepSeekV32HFAdapter

    conf = Path(loong_llm.__file__).parent / "conf" / "model"
    expected = yaml.safe_load((conf / "deepseek_v3_671b.yaml").read_text())
    own = yaml.safe_load((conf / "deepseek_v32_671b.yaml").read_text())
    assert own.pop("defaults") == ["deepseek_v3_671b", "_self_"]
    expected.update(own)
    for key in ("name", "dsa_indexer_loss_coeff", "dsa_indexer_use_sparse_loss"):  # not in config.json
        expected.pop(key)
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096}
    fields = DeepSeekV32HFAdapter().config_from_hf(tf.DeepseekV32Config(rope_parameters=yarn).to_dict())
    got = {k: fields[k] for k in expected}
    scaling = got.pop("rope_scaling")
    assert {k: getattr(scaling, k) for k in expected.pop("rope_scaling")} == {
        k: v for k, v in yarn.items() if k != "rope_theta"}
    assert got == expected
