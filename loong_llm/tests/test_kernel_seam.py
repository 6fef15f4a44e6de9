"""The megatron spec seam on the LLM families: every op reaches the model through it, the results
equal the plain path, and SDPA attention trains like the materialised-scores attention."""

from __future__ import annotations

import pytest
import torch

from loong_core import kernels
from loong_core.testing import losses, megatron_single_rank, registry_with_test_kernels, run_train

OPS = ("rms_norm", "swiglu", "rope", "cross_entropy", "linear_cross_entropy")
PLAIN = {op: "torch" for op in OPS}  # megatron-core's own modules (auto would pick analytic RMSNorm)


@pytest.fixture(scope="module")
def mcore():
    with megatron_single_rank():
        yield


def seam_registry():
    """The installed kernels plus ``<op>:ref``: each torch reference under a non-plain name, so
    the seam's modules replace megatron-core's (the computation stays the reference's)."""
    return registry_with_test_kernels({f"{op}:ref": f"loong_core.kernels.reference:{op}" for op in OPS})


def build(family: str, config_kwargs: dict, choices: dict | None):
    """A model chunk of ``family`` built under ``choices`` (None: the plain path)."""
    import importlib

    kernels.reset()
    kernels.configure(choices or PLAIN, "cpu", seam_registry())
    config_mod = importlib.import_module(f"loong_llm.families.{family}.config")
    model_mod = importlib.import_module(f"loong_llm.families.{family}.model")
    config_cls = next(v for k, v in vars(config_mod).items() if k.endswith("Config") and k != "DecoderConfig"
                      and getattr(v, "__module__", "") == config_mod.__name__)
    provider_cls = next(v for k, v in vars(model_mod).items() if k.endswith("Provider")
                        and getattr(v, "__module__", "") == model_mod.__name__)
    provider = provider_cls(config_cls(**config_kwargs))
    torch.manual_seed(0)
    return provider.build_megatron_model(provider.megatron_config({}), True, True, None)


def loss_and_grads(model, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 96, (2, 24), generator=g)
    positions = torch.arange(24).expand(2, 24)
    loss = model(tokens, positions, None, labels=torch.roll(tokens, -1, 1))
    loss.float().mean().backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


LLAMA = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
             ffn_hidden_size=128, vocab_size=96, max_position_embeddings=256)


@pytest.mark.parametrize("tied", [True, False])
def test_every_op_goes_through_the_seam_and_equals_the_plain_path(mcore, tied):
    from loong_core.engines.megatron.seam.modules import SeamCoreAttention, SeamRMSNorm, SeamSwiGLU

    kwargs = {**LLAMA, "untie_embeddings_and_output_weights": not tied}
    plain = build("llama", kwargs, None)
    seamed = build("llama", kwargs, {op: "ref" for op in OPS})
    kinds = {type(m) for m in seamed.modules()}
    assert {SeamRMSNorm, SeamSwiGLU, SeamCoreAttention} <= kinds
    assert SeamRMSNorm not in {type(m) for m in plain.modules()}
    assert type(seamed.decoder.final_layernorm) is SeamRMSNorm
    calls = []
    original = type(seamed).linear_cross_entropy
    type(seamed).linear_cross_entropy = lambda self, h, y: calls.append(1) or original(self, h, y)
    try:
        loss, grads = loss_and_grads(seamed)
    finally:
        type(seamed).linear_cross_entropy = original
    kernels.reset()
    kernels.configure(PLAIN, "cpu", seam_registry())
    expected, expected_grads = loss_and_grads(plain)
    assert calls, "the fused output-layer loss was not used"
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_mla_family_uses_the_seam_attention(mcore):
    from loong_core.engines.megatron.seam.modules import SeamCoreAttention

    kwargs = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=96,
                  max_position_embeddings=256, ffn_hidden_size=128, q_lora_rank=32,
                  kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16,
                  num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_layer_freq=[0, 1])
    model = build("deepseek_v3", kwargs, None)
    assert sum(isinstance(m, SeamCoreAttention) for m in model.modules()) == 2
    loss, _ = loss_and_grads(model)
    assert torch.isfinite(loss).all()


RUN = ["experiment=llama_debug", "trainer.train_iters=5", "trainer.log_interval=1",
       "trainer.eval_interval=0", "trainer.save_at_end=false", "trainer.tensorboard=false",
       "trainer.progress_bar=false"]


def test_llama_debug_trains_with_sdpa_like_the_materialised_attention(tmp_path):
    runs = {}
    for attention in ("sdpa", "eager"):
        run_dir = tmp_path / attention
        result = run_train([*RUN, f"kernels.attention={attention}", f"trainer.run_dir={run_dir}"])
        assert f"attention={attention}" in result.stdout + result.stderr
        runs[attention] = losses(run_dir)
    assert len(runs["sdpa"]) == 5
    for step, loss in runs["eager"].items():
        assert abs(runs["sdpa"][step] - loss) < 1e-5, (step, runs)
