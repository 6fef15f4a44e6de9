"""loong's grouped experts (``model.moe_grouped_gemm``) stand in for megatron-core's SequentialMLP:
the same initial weights from the same seed, the same loss and gradients (fp32, within 1e-6)
with an expert that gets no token, and the same distributed-checkpoint tensors (the matmul paths
themselves: loong_core/tests/test_grouped_matmul.py)."""

from __future__ import annotations

import pytest
import torch

from loong_core.testing import megatron_single_rank

QWEN3_MOE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
                 ffn_hidden_size=96, moe_ffn_hidden_size=32, num_experts=4, moe_router_topk=2,
                 vocab_size=96, max_position_embeddings=128)


@pytest.fixture(scope="module")
def mcore():
    with megatron_single_rank():
        yield


def build(grouped: bool):
    from loong_core import kernels
    from loong_llm.families.qwen3_moe.config import Qwen3MoEConfig
    from loong_llm.families.qwen3_moe.model import Qwen3MoEProvider

    kernels.reset()
    kernels.configure({}, "cpu")
    provider = Qwen3MoEProvider(Qwen3MoEConfig(**QWEN3_MOE, moe_grouped_gemm=grouped))
    torch.manual_seed(0)
    return provider.build_megatron_model(provider.megatron_config({}), True, True, None)


def stacked(named: dict) -> dict:
    """``named`` (SequentialMLP's names) with each layer's per-expert weights stacked under the
    grouped experts' names (``local_experts.E.linear_fc1.weight`` -> ``fc1_weight[E]``)."""
    out: dict = {}
    for name, value in named.items():
        if "local_experts." not in name:
            out[name] = value
            continue
        head, tail = name.split("local_experts.")
        expert, rest = tail.split(".", 1)
        if rest.endswith("_extra_state"):  # None: megatron-core's linear layers keep nothing
            continue
        out.setdefault(head + rest.replace("linear_", "").replace(".weight", "_weight"), {})[int(expert)] = value
    return {n: torch.stack([v[e] for e in sorted(v)]) if isinstance(v, dict) else v for n, v in out.items()}


def loss_and_grads(model, starve: int):
    """Loss and gradients of one batch, every router kept from expert ``starve``."""
    from megatron.core.transformer.moe.router import TopKRouter

    for router in (m for m in model.modules() if isinstance(m, TopKRouter)):
        def gating(x, inner=router.gating):
            logits = inner(x)
            return logits - 1e4 * torch.nn.functional.one_hot(torch.tensor(starve), logits.shape[-1])
        router.gating = gating
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 96, (2, 16), generator=g)
    loss = model(tokens, torch.arange(16).expand(2, 16), None, labels=torch.roll(tokens, -1, 1))
    loss.float().mean().backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def pair(mcore):
    return build(True), build(False)


def test_grouped_experts_start_from_the_weights_sequential_experts_draw(pair):
    from loong_llm.families.common.grouped_experts import GroupedExperts

    grouped, sequential = pair
    experts = [m for m in grouped.modules() if isinstance(m, GroupedExperts)]
    assert len(experts) == 2 and tuple(experts[0].fc1_weight.shape) == (4, 64, 64)
    want, got = stacked(sequential.state_dict()), grouped.state_dict()
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] is want[name] is None or torch.equal(got[name], want[name]), name


def test_loss_and_gradients_equal_sequential_experts_with_an_expert_without_tokens(pair):
    grouped, sequential = pair
    loss_g, grads_g = loss_and_grads(grouped, starve=2)
    loss_s, grads_s = loss_and_grads(sequential, starve=2)
    torch.testing.assert_close(loss_g, loss_s, atol=1e-6, rtol=0)
    grads_s = stacked(grads_s)
    assert sorted(grads_g) == sorted(grads_s)
    for name, grad in grads_s.items():
        torch.testing.assert_close(grads_g[name], grad, atol=1e-6, rtol=1e-6, msg=name)
    fc1 = grads_g["decoder.layers.0.mlp.experts.fc1_weight"]
    assert fc1[2].abs().max() == 0 and fc1[0].abs().max() > 0  # expert 2 got no token: zero grads


def test_row_buckets_pad_each_experts_rows_and_leave_the_numbers_alone(pair, monkeypatch):
    from loong_core.kernels import grouped_matmul

    grouped, sequential = pair
    monkeypatch.setattr(grouped_matmul, "row_bucket", lambda x: 4)   # the padded path, in fp32
    loss_g, grads_g = loss_and_grads(grouped, starve=2)
    loss_s, grads_s = loss_and_grads(sequential, starve=2)
    torch.testing.assert_close(loss_g, loss_s, atol=1e-6, rtol=0)
    for name, grad in stacked(grads_s).items():
        torch.testing.assert_close(grads_g[name], grad, atol=1e-6, rtol=1e-6, msg=name)


def test_checkpoint_tensors_are_those_of_sequential_experts(pair):
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, ShardedTensorFactory

    def tensors(model, metadata=None):
        """Expert tensors and objects: ``(key, offset) -> (shape, fragmentation, replica, data)``."""
        out = {}
        for value in model.sharded_state_dict(metadata=metadata).values():
            built = value.build() if isinstance(value, ShardedTensorFactory) else value
            for t in nested_values(built) if isinstance(built, (dict, list)) else [built]:
                if isinstance(t, ShardedTensor) and ".experts." in t.key:
                    out[(t.key, t.global_offset)] = (t.global_shape, t.axis_fragmentations,
                                                     t.replica_id, t.data.clone())
                elif isinstance(t, ShardedObject) and ".experts." in t.key:
                    out[(t.key, t.global_offset)] = (t.global_shape, None, t.replica_id, None)
        return out

    grouped, sequential = pair
    for metadata in (None, {"singleton_local_shards": True}):
        got, want = tensors(grouped, metadata), tensors(sequential, metadata)
        # per layer and expert: fc1 as gate and up, fc2, and two _extra_state objects
        assert len(want) == 2 * 4 * 5 and sorted(got) == sorted(want)
        for key, (*layout, data) in want.items():
            assert got[key][:3] == tuple(layout), key
            assert (data is None and got[key][3] is None) or torch.equal(got[key][3], data), key


def test_the_dispatcher_skips_reordering_chunks_already_in_order_and_the_numbers_stay(pair, monkeypatch):
    """At EP1 / TP1 megatron-core's alltoall dispatcher sorts the expert chunks into the order they
    are in: loong's dispatcher hook returns them as they are (no copy), bit-identical, and a real
    reordering still goes to megatron-core's function."""
    from megatron.core.transformer.moe import token_dispatcher

    from loong_llm.families.common import expert_chunks

    grouped, _ = pair
    assert token_dispatcher.sort_chunks_by_idxs is expert_chunks.sort_chunks_by_idxs  # installed by the build
    original = expert_chunks._original
    tokens, probs = torch.arange(12.0).view(6, 2), torch.arange(6.0)
    sizes, order = torch.tensor([1, 3, 2]), torch.tensor([2, 0, 1])
    out, out_probs = expert_chunks.sort_chunks_by_idxs(tokens, sizes, torch.arange(3))
    assert out is tokens and out_probs is None
    out, out_probs = expert_chunks.sort_chunks_by_idxs(tokens, sizes, order, probs=probs)
    want, want_probs = original(tokens, sizes, order, probs=probs)
    assert torch.equal(out, want) and torch.equal(out_probs, want_probs)
    assert out_probs.tolist() == [4.0, 5.0, 0.0, 1.0, 2.0, 3.0]

    calls = []

    def counted(*args, **kwargs):
        calls.append(args[2])
        return original(*args, **kwargs)

    def fresh_loss_and_grads():
        grouped.zero_grad(set_to_none=True)
        loss, grads = loss_and_grads(grouped, starve=2)
        return loss, {name: grad.clone() for name, grad in grads.items() if grad is not None}

    monkeypatch.setattr(expert_chunks, "_original", counted)
    loss_hook, grads_hook = fresh_loss_and_grads()
    assert calls == []  # every reordering at EP1 was the identity, and none copied
    monkeypatch.setattr(token_dispatcher, "sort_chunks_by_idxs", counted)
    loss_ref, grads_ref = fresh_loss_and_grads()
    assert len(calls) == 2 * 2  # megatron-core's own path: the dispatch and the combine of each layer
    assert all(expert_chunks.is_identity(order) for order in calls)
    assert torch.equal(loss_hook, loss_ref)
    assert sorted(grads_hook) == sorted(grads_ref) and grads_ref
    for name, grad in grads_ref.items():
        assert torch.equal(grads_hook[name], grad), name
