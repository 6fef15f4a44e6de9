"""The kernel seam: resolution per op and device, config errors, the banner line, ``loong doctor``,
the references against megatron-core, and SDPA attention against the materialised-scores path."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from loong_core import kernels
from loong_core.config.schema import KernelsConfig
from loong_core.errors import ConfigError
from loong_core.kernels import attention as attn
from loong_core.kernels import reference as ref
from loong_core.kernels.ops import OPS
from loong_core.kernels.resolve import check_names, is_available, resolve_all, resolve_op
from loong_core.plugins import get_plugin_system
from loong_core.plugins.registry import KINDS, Entry, Registry


def registry_with(*extra: tuple[str, str, dict]) -> Registry:
    """The process's registry plus test-only kernels ``(name, target, meta)``."""
    reg = Registry()
    for kind in KINDS:
        for entry in get_plugin_system().registry().entries(kind):
            reg.add(entry)
    for name, target, meta in extra:
        reg.add(Entry("kernel", name, target, "test", "test-kernels", meta))
    return reg


FAST = ("rms_norm:fast", "loong_core.kernels.reference:rms_norm",
        {"available": "loong_core.kernels.availability:always", "auto_on": ("cuda",),
         "auto_priority": 1000})
BROKEN = ("rms_norm:broken", "loong_core.kernels.reference:rms_norm",
          {"available": "builtins:bool"})  # bool() is False: never available


@pytest.fixture(autouse=True)
def fresh_resolution():
    kernels.reset()
    yield
    kernels.reset()


def test_kernels_config_has_one_key_per_op():
    assert [f.name for f in dataclasses.fields(KernelsConfig)] == list(OPS)


def test_auto_is_the_plain_backend_on_cpu_but_analytic_rms_norm_and_sdpa_for_attention():
    choices = resolve_all({}, "cpu", get_plugin_system().registry())
    assert {op: c.backend for op, c in choices.items()} == {
        **{op: "torch" for op in OPS}, "rms_norm": "analytic", "attention": "sdpa"}


def test_auto_prefers_a_backend_registered_for_the_device():
    reg = registry_with(FAST)
    assert resolve_op("rms_norm", "auto", "cuda", reg).backend == "fast"
    assert resolve_op("rms_norm", "auto", "cpu", reg).backend == "analytic"  # every device's


def test_unknown_backend_is_a_config_error_listing_the_registered_ones():
    with pytest.raises(ConfigError, match=r"'kernels.rms_norm' = 'tourch'.*Did you mean 'torch'.*"
                                          r"Choices: auto, analytic, compile, torch"):
        check_names({"rms_norm": "tourch"}, get_plugin_system().registry())


def test_unavailable_backend_is_a_config_error_listing_the_available_ones():
    with pytest.raises(ConfigError, match=r"'kernels.rms_norm' = 'broken' is not available.*"
                                          r"Available: auto, analytic, compile, torch"):
        resolve_op("rms_norm", "broken", "cpu", registry_with(BROKEN))


def test_kernels_group_and_keys_compose_and_a_bad_backend_fails_validation(toy_site):
    from loong_core.config.compose import load_config

    cfg = load_config(["experiment=toy", "kernels=torch", "kernels.attention=eager"])
    assert cfg.kernels.rms_norm == "torch" and cfg.kernels.attention == "eager"
    with pytest.raises(ConfigError, match=r"'kernels.attention' = 'flash9' is not a registered"):
        load_config(["experiment=toy", "kernels.attention=flash9"])


def test_accessor_returns_the_resolved_callable_and_the_banner_names_it():
    from loong_core.trainer.banner import kernels_line

    kernels.configure({"rms_norm": "fast"}, "cpu", registry_with(FAST))
    assert kernels.get("rms_norm") is ref.rms_norm
    assert kernels.backend("rms_norm") == "fast" and not kernels.is_plain("rms_norm")
    assert kernels_line().startswith("kernels: rms_norm=fast swiglu=torch rope=torch")
    assert kernels_line().endswith("attention=sdpa")


def test_doctor_reports_versions_devices_and_the_kernel_table(capsys):
    from loong_core.cli import doctor_cmd

    assert doctor_cmd.run(argparse.Namespace(json=True), []) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["versions"]["torch"].startswith("2.")
    assert {"name": "cpu", "available": True}.items() <= data["devices"][0].items()
    assert data["kernels"]["ops"]["rms_norm"]["torch"] is True
    assert data["kernels"]["auto"]["attention"] == "sdpa"
    doctor_cmd.run(argparse.Namespace(json=False), [])
    table = capsys.readouterr().out
    assert "attention" in table and "yes*" in table


def test_auto_picks_compile_on_cpu_only_for_runs_long_enough_to_recover_the_compile_cost(capsys):
    from loong_core.cli import doctor_cmd
    from loong_core.kernels.ops import COMPILE_AUTO_MIN_STEPS_CPU as steps

    reg = get_plugin_system().registry()
    compiles = is_available(reg.get("kernel", "rms_norm:compile"))
    assert resolve_op("swiglu", "auto", "cpu", reg).backend == "torch"  # no loong train: no steps
    assert resolve_op("swiglu", "auto", "cpu", reg, train_steps=steps - 1).backend == "torch"
    assert resolve_op("swiglu", "auto", "cpu", reg, train_steps=steps).backend == ("compile" if compiles
                                                                                    else "torch")
    assert resolve_op("swiglu", "auto", "cuda", reg, train_steps=10 * steps).backend != "compile"
    assert resolve_op("attention", "auto", "cpu", reg, train_steps=steps).backend == "sdpa"
    doctor_cmd.run(argparse.Namespace(json=False), [])
    if compiles:
        assert f"auto picks compile on cpu for runs of >= {steps} steps" in capsys.readouterr().out


def test_a_resumed_run_keeps_its_checkpoints_backends_for_the_ops_left_at_auto():
    from loong_core.kernels.ops import COMPILE_AUTO_MIN_STEPS_CPU as steps

    reg = registry_with(BROKEN)
    kept = {"rms_norm": "torch", "swiglu": "compile", "attention": "sdpa", "layer_norm_modulate": "gone"}
    choices = resolve_all({"swiglu": "torch"}, "cpu", reg, train_steps=steps, keep=kept)
    assert choices["rms_norm"].backend == "torch"    # auto would compile a run this long (where it can)
    assert choices["swiglu"].backend == "torch"      # pinned: the config wins over the checkpoint
    assert choices["attention"].backend == "sdpa"
    assert choices["layer_norm_modulate"].backend == resolve_op("layer_norm_modulate", "auto", "cpu", reg,
                                                                steps).backend   # an unknown backend
    broken = resolve_all({}, "cpu", reg, keep={"rms_norm": "broken"})["rms_norm"]  # not available here
    assert broken.backend == "analytic"
    assert resolve_all({}, "cpu", reg, keep={"rms_norm": "compile"})["rms_norm"].backend == (
        "compile" if is_available(reg.get("kernel", "rms_norm:compile")) else "analytic")


def test_a_checkpoint_records_the_kernels_and_device_its_run_trained_with(tmp_path):
    from loong_core.checkpoint import store
    from loong_core.testing import run_train

    run_train(["experiment=llama_debug", "trainer.train_iters=1", "trainer.eval_interval=0",
               "trainer.eval_at_start=false", f"trainer.run_dir={tmp_path}"])
    record = store.read_record(store.find_latest(tmp_path / "checkpoints"))
    assert record["device_type"] == "cpu"
    assert record["kernels"] == {**{op: "torch" for op in OPS}, "rms_norm": "analytic", "attention": "sdpa"}


def test_doctor_versions_import_nothing_heavy():
    code = ("import sys; from loong_core.cli.doctor_cmd import versions; v = versions(); "
            "assert 'torch' not in sys.modules and 'megatron' not in sys.modules, sorted(sys.modules); "
            "print(v['torch'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith("2.")


# -- references ------------------------------------------------------------------------------
def test_rms_norm_with_residual_returns_the_sum():
    x, r, w = torch.randn(3, 5, 8), torch.randn(3, 5, 8), torch.rand(8)
    out, h = ref.rms_norm(x, w, 1e-6, residual=r)
    assert torch.equal(h, x + r)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x + r, (8,), w, 1e-6))


def test_rope_matches_megatron_core():
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    t, freqs = torch.randn(7, 2, 3, 16), torch.randn(7, 1, 1, 12)
    assert torch.equal(ref.rope(t, freqs), _apply_rotary_pos_emb_bshd(t, freqs))


@pytest.fixture(scope="module")
def mcore():
    from loong_core.testing import megatron_single_rank

    with megatron_single_rank():
        yield


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_matches_megatron_vocab_parallel(mcore, smoothing):
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits, labels = torch.randn(6, 4, 37), torch.randint(0, 37, (6, 4))
    expected = vocab_parallel_cross_entropy(logits.clone(), labels, smoothing)
    torch.testing.assert_close(ref.cross_entropy(logits, labels, smoothing), expected,
                               rtol=1e-6, atol=1e-6)
    group = parallel_state.get_tensor_model_parallel_group()
    assert torch.equal(ref.cross_entropy(logits.clone(), labels, smoothing, group), expected)


def test_linear_cross_entropy_is_cross_entropy_of_the_projection():
    h, w, y = torch.randn(10, 8), torch.randn(29, 8), torch.randint(0, 29, (10,))
    torch.testing.assert_close(ref.linear_cross_entropy(h, w, y, 0.1),
                               ref.cross_entropy(h @ w.t(), y, 0.1))


# -- attention -------------------------------------------------------------------------------
def _qkv(b=2, hq=4, hk=2, s=37, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=g, requires_grad=True) for h in (hq, hk, hk)]


PACKED = torch.tensor([[0] * 10 + [1] * 20 + [2] * 7, [0] * 5 + [1] * 5 + [2] * 27])
WINDOWS = torch.tensor([[0, 1, 2, 3] * 9 + [3], [3, 2, 1, 0] * 9 + [1]])  # scattered segments
CASES = {
    "causal_gqa": dict(causal=True),
    "bidirectional": dict(causal=False),
    "packed_documents": dict(causal=True, segment_ids=PACKED),
    "vision_windows": dict(causal=False, segment_ids=WINDOWS),
    "dense_mask": dict(causal=False, mask=torch.rand(2, 1, 37, 37, generator=torch.Generator().manual_seed(1)) > 0.3),
}


@pytest.mark.parametrize("case", CASES)
def test_sdpa_matches_materialised_attention_forward_and_backward(case):
    q, k, v = _qkv()
    expected = ref.attention(q, k, v, **CASES[case])
    out = attn.sdpa(q, k, v, **CASES[case])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_block_diagonal_masks_become_segment_ids():
    from loong_core.engines.megatron.seam.modules import mask_to_pattern

    same = PACKED[:, :, None] == PACKED[:, None, :]
    causal_blocks = ~(same & torch.ones(37, 37, dtype=torch.bool).tril())[:, None]
    causal, segments, dense = mask_to_pattern(causal_blocks)
    assert causal and dense is None and torch.equal(segments[:, None] == segments[:, :, None], same)
    windows = ~(WINDOWS[:, :, None] == WINDOWS[:, None, :])[:, None]
    causal, segments, dense = mask_to_pattern(windows)
    assert not causal and dense is None
    assert mask_to_pattern(~CASES["dense_mask"]["mask"])[1] is None


@pytest.mark.parametrize("packed", [None, "dense", "segments"])
def test_seam_core_attention_equals_megatron_dot_product_attention(mcore, packed):
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from loong_core.engines.megatron.seam.modules import SeamCoreAttention

    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4,
                               num_query_groups=2, use_cpu_initialization=True,
                               masked_softmax_fusion=False, attention_dropout=0.0)
    old = DotProductAttention(config, 1, AttnMaskType.causal, "self")
    new = SeamCoreAttention(config, 1, AttnMaskType.causal, "self")
    q, k, v = (t.permute(2, 0, 1, 3).detach().requires_grad_() for t in _qkv(hq=4, hk=2, d=16))
    mask = None
    if packed:
        same = PACKED[:, :, None] == PACKED[:, None, :]
        mask = ~(same & torch.ones(37, 37, dtype=torch.bool).tril())[:, None]
    expected = old(q, k, v, mask)
    if packed == "segments":  # what packed data gives: segment ids, no [s, s] mask
        from loong_core.kernels.segment_mask import segment_mask

        seg = segment_mask(PACKED)
        assert torch.equal(seg.dense(), mask)
        mask = seg
    out = new(q, k, v, mask)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for g, e in zip(grads, torch.autograd.grad(expected.sum(), (q, k, v))):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_seam_core_attention_takes_scattered_windows_as_group_ids(mcore):
    """A BlockDiagonalMask (vision windows as group ids, attended both ways, the groups scattered
    over the positions) gives what the same mask given densely gives, forward and backward."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from loong_core.engines.megatron.seam.modules import SeamCoreAttention
    from loong_core.kernels.segment_mask import block_diagonal_mask

    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                               use_cpu_initialization=True, attention_dropout=0.0)
    attention = SeamCoreAttention(config, 1, AttnMaskType.no_mask, "self")
    q, k, v = (t.permute(2, 0, 1, 3).detach().requires_grad_() for t in _qkv(hq=4, hk=2, d=16))
    groups = block_diagonal_mask(WINDOWS)
    dense = ~(WINDOWS[:, :, None] == WINDOWS[:, None, :])[:, None]
    assert torch.equal(groups.dense(), dense)
    out, expected = attention(q, k, v, groups), attention(q, k, v, dense)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for g, e in zip(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(expected.sum(), (q, k, v))):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    unmasked = attention(q, k, v, None)
    assert (out - unmasked).abs().max() > 1e-3  # the groups do mask


def test_seam_core_attention_takes_thd_packed_seq_params_as_segments(mcore):
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from loong_core.engines.megatron.seam.modules import SeamCoreAttention
    from loong_core.kernels.segment_mask import segment_mask

    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                               use_cpu_initialization=True, attention_dropout=0.0)
    attn = SeamCoreAttention(config, 1, AttnMaskType.causal, "self")
    q, k, v = (t[:1].permute(2, 0, 1, 3) for t in _qkv(hq=4, hk=2, d=16))  # [37, 1, n, d]
    expected = attn(q, k, v, segment_mask(PACKED[:1]))  # documents of 10, 20 and 7 tokens
    cu = torch.tensor([0, 10, 30], dtype=torch.int32)  # the last 7 tokens: one more segment
    thd = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    out = attn(q.squeeze(1), k.squeeze(1), v.squeeze(1), None, packed_seq_params=thd)
    torch.testing.assert_close(out.reshape(expected.shape), expected, rtol=0, atol=0)
    bad = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=torch.tensor([0, 37]))
    with pytest.raises(NotImplementedError, match="differ"):
        attn(q.squeeze(1), k.squeeze(1), v.squeeze(1), None, packed_seq_params=bad)


# -- torch engine ----------------------------------------------------------------------------
class LlamaStyleRMSNorm(torch.nn.Module):
    """The transformers layout: ``weight`` and ``variance_epsilon``."""

    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(d))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def test_torch_engine_swaps_rms_norms_keeping_parameters_and_outputs():
    from loong_core.kernels.torch_modules import SeamRMSNorm, swap_modules

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), LlamaStyleRMSNorm(8), torch.nn.RMSNorm(8, eps=1e-5))
    x = torch.randn(3, 8)
    expected, keys = model(x), set(model.state_dict())
    kernels.configure({"rms_norm": "torch"}, "cpu")
    assert swap_modules(model) == []  # plain rms_norm: the library's modules stay
    reg = registry_with(("rms_norm:ref", "loong_core.kernels.reference:rms_norm", {}))
    kernels.configure({"rms_norm": "ref"}, "cpu", reg)
    weight = model[1].weight
    assert swap_modules(model) == ["1", "2"]
    assert isinstance(model[1], SeamRMSNorm) and model[1].weight is weight
    assert set(model.state_dict()) == keys
    torch.testing.assert_close(model(x), expected, rtol=1e-6, atol=1e-6)


def test_norm_modulate_is_the_plain_expression_or_the_op():
    from loong_core.kernels.torch_modules import norm_modulate

    norm = torch.nn.LayerNorm(8, elementwise_affine=False, eps=1e-6)
    x, shift, scale = torch.randn(2, 5, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    kernels.configure({}, "cpu")
    assert torch.equal(norm_modulate(norm, x, shift, scale), norm(x) * (1 + scale) + shift)
    reg = registry_with(("layer_norm_modulate:ref", "loong_core.kernels.reference:layer_norm_modulate", {}))
    kernels.configure({"layer_norm_modulate": "ref"}, "cpu", reg)
    torch.testing.assert_close(norm_modulate(norm, x, shift, scale), norm(x) * (1 + scale) + shift)
