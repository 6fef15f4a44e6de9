"""The seam's linear layers put megatron-core's weight gradients into ``main_grad``, bit for bit."""

from __future__ import annotations

import pytest
import torch

from loong_core.engines.megatron.seam import linear
from loong_core.testing import megatron_single_rank

VOCAB, SEQ, BATCH = 64, 8, 2


@pytest.fixture(scope="module")
def mcore():
    with megatron_single_rank():
        yield


def _model(tied: bool):
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from loong_core.engines.megatron.seam import spec as seam_spec
    from loong_core.engines.megatron.seam.gpt import SeamGPTModel

    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=48,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, add_qkv_bias=True, hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, bias_activation_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, **seam_spec.transformer_kwargs())
    tensor_parallel.model_parallel_cuda_manual_seed(7)
    torch.manual_seed(7)
    spec = seam_spec.apply(get_gpt_layer_local_spec(normalization="RMSNorm"), config)
    return config, SeamGPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB,
                                max_sequence_length=SEQ, share_embeddings_and_output_weights=tied,
                                position_embedding_type="rope")


def _grads(tied: bool, overlap: bool, seam: bool, monkeypatch,
           checkpoint: bool = False) -> dict[str, torch.Tensor]:
    """``main_grad`` of every parameter after two micro-batches and the gradient sync."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    config, model = _model(tied)
    ddp = DistributedDataParallel(config=config, module=model, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=overlap, use_distributed_optimizer=overlap))
    if not seam:
        monkeypatch.setattr(linear, "covers", lambda *args: False)
    generator = torch.Generator().manual_seed(3)
    positions = torch.arange(SEQ).expand(BATCH, -1)
    ddp.zero_grad_buffer()
    for _ in range(2):  # the second micro-batch accumulates onto a non-zero main_grad
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
        if checkpoint:  # torch's non-reentrant checkpoint: saved tensors come back through hooks
            loss = torch.utils.checkpoint.checkpoint(
                lambda t: ddp(t, positions, None, labels=t).sum(), tokens, use_reentrant=False)
        else:
            loss = ddp(tokens, positions, None, labels=tokens).sum()
        loss.backward()
    ddp.finish_grad_sync()
    monkeypatch.undo()
    for name, param in model.named_parameters():
        assert param.grad is None, name  # the DDP hook took every gradient
    return {name: param.main_grad.clone() for name, param in model.named_parameters()}


@pytest.mark.parametrize("tied, overlap", [(True, False), (False, True)])
def test_main_grad_equals_megatron_cores(mcore, monkeypatch, tied, overlap):
    """Tied embeddings (the output layer's gradient meets the embedding's) and untied, with
    ``overlap_grad_reduce`` + the distributed optimizer (the hook must still fire per weight)."""
    calls = []
    original = linear.accumulate_weight_grad
    monkeypatch.setattr(linear, "accumulate_weight_grad", lambda *a: calls.append(1) or original(*a))
    new = _grads(tied, overlap, seam=True, monkeypatch=monkeypatch)
    assert len(calls) == 2 * (4 * 2 + 1)  # 2 micro-batches x (4 linears x 2 layers + output layer)
    ref = _grads(tied, overlap, seam=False, monkeypatch=monkeypatch)
    assert new.keys() == ref.keys()
    for name in ref:
        assert torch.equal(new[name], ref[name]), name
        assert ref[name].abs().sum() > 0, name


def test_only_the_calls_it_serves_are_taken():
    weight = torch.nn.Parameter(torch.zeros(4, 3))
    assert not linear.covers(weight, False, False, None)  # not under megatron-core's DDP
    weight.main_grad, weight.grad_added_to_main_grad = torch.zeros(4, 3), False
    assert linear.covers(weight, False, False, None)
    assert not linear.covers(weight, True, False, None)  # megatron-core's fused kernel asked for
    assert not linear.covers(weight, False, True, None)  # sequence parallel: megatron-core's
    assert not linear.covers(weight, False, False, [])  # deferred embedding wgrad
    bf16 = torch.nn.Parameter(torch.zeros(4, 3, dtype=torch.bfloat16))
    bf16.main_grad, bf16.grad_added_to_main_grad = torch.zeros(4, 3), False
    assert not linear.covers(bf16, False, False, None)  # mixed precision: megatron-core's path
    weight.register_hook(lambda grad: grad)  # a hook that needs the real gradient (the VLM's
    assert not linear.covers(weight, False, False, None)  # sharded encoder sums it over replicas)


def test_main_grad_under_torchs_non_reentrant_checkpoint(mcore, monkeypatch):
    """The function keeps the parameter itself (saved-tensor hooks would lose ``main_grad``)."""
    new = _grads(False, False, seam=True, monkeypatch=monkeypatch, checkpoint=True)
    ref = _grads(False, False, seam=False, monkeypatch=monkeypatch)
    for name in ref:
        assert torch.equal(new[name], ref[name]), name
