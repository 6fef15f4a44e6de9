"""Qwen3-Next specifics: packed documents never leak through the Gated DeltaNet layers (the
convolution and the recurrent state restart at each document), the hybrid pattern and the MoE
fields read from a published-style config.json, and the layouts the family refuses say why.

Logits against transformers (TP1/TP2/PP2/EP2), the HF round trip and the TP2 (SP) / EP2 curves are
in the shared family tests (``test_hf_parity.py``, ``test_hf_convert.py``,
``test_family_layouts.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loong_core.config.compose import load_config
from loong_core.errors import ConfigError
from loong_core.kernels.segment_mask import segment_mask
from loong_core.testing import megatron_single_rank
from loong_llm.data.packing import packed_sample


@pytest.fixture(scope="module")
def tiny_qwen3_next():
    """A random tiny Qwen3-Next (Gated DeltaNet, gated attention, Gated DeltaNet) on one rank."""
    from loong_llm.families.qwen3_next.config import Qwen3NextConfig
    from loong_llm.families.qwen3_next.model import Qwen3NextProvider

    with megatron_single_rank():
        torch.manual_seed(0)
        provider = Qwen3NextProvider(Qwen3NextConfig(
            name="qwen3_next", num_layers=3, hidden_size=64, num_attention_heads=4,
            num_query_groups=2, kv_channels=16, ffn_hidden_size=96, vocab_size=96,
            max_position_embeddings=256, linear_attention_freq=[1, 0, 1], linear_key_head_dim=8,
            linear_value_head_dim=12, linear_num_key_heads=2, linear_num_value_heads=4,
            num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
            moe_shared_expert_intermediate_size=32))
        config = provider.megatron_config({})
        model = provider.build_megatron_model(config, pre_process=True, post_process=True, vp_stage=None)
        with torch.no_grad():  # non-trivial norms (zero-centred: 0 is the identity)
            for name, p in model.named_parameters():
                if name.endswith("layernorm.weight"):
                    p.normal_(0.0, 0.2)
        yield model.eval()


def test_packed_documents_equal_each_document_alone(tiny_qwen3_next):
    model = tiny_qwen3_next
    rng = np.random.default_rng(0)
    lengths = [9, 70, 5, 12]  # one document longer than a 64-token chunk of the delta rule
    docs = [rng.integers(1, 96, size=n + 1) for n in lengths]
    sample = packed_sample([(d, np.ones_like(d)) for d in docs], seq_length=104, pad_id=0)
    with torch.no_grad():
        packed = model(sample["tokens"][None], sample["position_ids"][None],
                       segment_mask(sample["segment_ids"][None]))[0]
        start, worst = 0, 0.0
        for d, n in zip(docs, lengths):
            alone = model(torch.as_tensor(d[:-1], dtype=torch.long)[None], torch.arange(n)[None], None)[0]
            worst = max(worst, (packed[start: start + n] - alone).abs().max().item())
            start += n
        # without the documents' borders the later documents see the earlier ones
        leaky = model(sample["tokens"][None], sample["position_ids"][None], None)[0]
    assert worst < 1e-4, worst
    second = slice(lengths[0], lengths[0] + lengths[1])
    assert (leaky[second] - packed[second]).abs().max() > 1e-2


def test_causal_convolution_does_not_cross_documents():
    from loong_llm.families.qwen3_next.gated_delta_net import causal_conv

    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 10), torch.randn(3, 1, 4)
    segments = torch.tensor([[0] * 4 + [1] * 6, [0] * 10])
    got = causal_conv(x, w, segments)
    assert torch.allclose(got[1], causal_conv(x[1:], w, None)[0], atol=1e-6)
    assert torch.allclose(got[0, :, :4], causal_conv(x[:1, :, :4], w, None)[0], atol=1e-6)
    assert torch.allclose(got[0, :, 4:], causal_conv(x[:1, :, 4:], w, None)[0], atol=1e-6)


def test_published_style_config_reads_its_hybrid_pattern_and_writes_it_back():
    import transformers as tf

    from loong_llm.families.qwen3_next.config import Qwen3NextConfig
    from loong_llm.families.qwen3_next.hf_adapter import Qwen3NextHFAdapter

    hf = tf.Qwen3NextConfig(num_hidden_layers=8).to_dict()  # full attention every 4th layer
    adapter = Qwen3NextHFAdapter()
    fields = adapter.config_from_hf(hf)
    cfg = Qwen3NextConfig(name="qwen3_next", **fields)
    assert cfg.linear_layers() == [1, 1, 1, 0, 1, 1, 1, 0]
    assert cfg.rotary_percent == 0.25 and cfg.head_dim() == 256
    assert fields["moe_layer_freq"] == 1 and not fields["moe_router_pre_softmax"]
    out = adapter.config_to_hf(cfg)
    for key in ("layer_types", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "shared_expert_intermediate_size", "head_dim"):
        assert out[key] == hf[key], key
    assert out["rope_parameters"]["partial_rotary_factor"] == 0.25


@pytest.mark.parametrize("override,message", [
    ("parallel.context_parallel_size=2", "'parallel.context_parallel_size' = 2 with model 'qwen3_next': "
                                         "the Gated DeltaNet layers' recurrent state"),
    ("parallel.sequence_chunks=2", "'parallel.sequence_chunks' = 2 with model 'qwen3_next'"),
    ("model.mtp_num_layers=1", "the MTP layers of Qwen3-Next / Qwen3.5 are not supported yet"),
    ("model.linear_attention_freq=[1,0,1]", "must be an int or a 0/1 list of 2 entries"),
    ("model.linear_num_value_heads=5", "must be a multiple of model.linear_num_key_heads"),
])
def test_unsupported_settings_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(["experiment=qwen3_next_debug", override])


def test_key_heads_split_over_tensor_parallel_ranks_or_a_config_error():
    with pytest.raises(ConfigError, match="linear_num_key_heads' = 2 must be a multiple of "
                                          "parallel.tensor_model_parallel_size = 4"):
        load_config(["experiment=qwen3_next_debug", "parallel=tp2", "parallel.tensor_model_parallel_size=4",
                     "model.num_query_groups=4"])
