"""LoRA on megatron-core projections: frozen base, adapter-only gradients, exact merge."""

from __future__ import annotations

import pytest
import torch

from loong_core.errors import ConfigError
from loong_core.testing import free_port, megatron_single_rank
from loong_llm.lora import LORA_TARGETS, LoraConfig, apply_lora, lora_parameters, merge_lora


@pytest.fixture(scope="module")
def mcore_single_rank():
    """One-rank gloo group + megatron parallel state, with the cpu backend's patches."""
    with megatron_single_rank():
        yield


def tiny_llama(vocab_size: int = 96):
    from loong_llm.families.llama.config import LlamaConfig
    from loong_llm.families.llama.model import LlamaProvider

    torch.manual_seed(0)
    provider = LlamaProvider(LlamaConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                         num_query_groups=2, ffn_hidden_size=128, vocab_size=vocab_size,
                                         max_position_embeddings=256))
    return provider.build_megatron_model(provider.megatron_config({}), True, True, None)


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 96, (2, 24), generator=g)
    return tokens, torch.arange(24).expand(2, 24)


def test_config_validates_targets_and_rank():
    with pytest.raises(ConfigError, match="Unknown LoRA target 'linear_qvk'.*Did you mean 'linear_qkv'"):
        LoraConfig(rank=4, targets=["linear_qvk"])
    with pytest.raises(ConfigError, match="rank = -1"):
        LoraConfig(rank=-1)
    assert LoraConfig(rank=8, alpha=16).scaling == 2.0 and not LoraConfig().enabled


def test_adapters_start_as_identity_and_only_they_get_gradients(mcore_single_rank):
    model = tiny_llama()
    tokens, positions = batch()
    with torch.no_grad():
        base = model(tokens, positions, None)
    adapted = apply_lora(model, LoraConfig(rank=4, alpha=8))
    assert len(adapted) == 2 * len(LORA_TARGETS)
    with torch.no_grad():
        assert torch.equal(model(tokens, positions, None), base)  # B = 0 at init
    loss = model(tokens, positions, None, labels=tokens).float().mean()
    loss.backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(lora_parameters(model)) and len(trainable) == 2 * len(adapted)
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)
    assert all(model.get_parameter(n).grad is not None for n in trainable if ".lora_B." in n)


def test_merged_model_equals_adapted_model(mcore_single_rank):
    model = tiny_llama()
    apply_lora(model, LoraConfig(rank=4, alpha=8, targets=list(LORA_TARGETS)))
    with torch.no_grad():
        for name, param in lora_parameters(model).items():
            if ".lora_B." in name:
                param.normal_(0.0, 0.05)  # as if trained
        tokens, positions = batch(1)
        adapted = model(tokens, positions, None)
        before = {k: v.clone() for k, v in model.state_dict().items() if "lora" not in k and "extra" not in k}
        assert merge_lora(model) == 2 * len(LORA_TARGETS)
        merged = model(tokens, positions, None)
    diff = (merged - adapted).abs().max().item()
    print(f"LoRA merged vs adapted logits: max abs diff {diff:.3e}")
    assert diff < 1e-4
    assert not lora_parameters(model) and not any("lora" in k for k in model.state_dict())
    changed = [k for k, v in model.state_dict().items() if k in before and not torch.equal(v, before[k])]
    assert changed and all(k.rsplit(".", 2)[-2] in LORA_TARGETS for k in changed)


def test_sharded_state_dict_includes_adapters(mcore_single_rank):
    model = tiny_llama()
    apply_lora(model, LoraConfig(rank=2, targets=["linear_qkv", "linear_proj"]))
    keys = set(model.sharded_state_dict().keys())
    assert "decoder.layers.0.self_attention.linear_qkv.lora_B.weight" in keys
    assert "decoder.layers.0.self_attention.linear_proj.lora_A.weight" in keys


def test_no_matching_target_is_an_error(mcore_single_rank):
    with pytest.raises(ConfigError, match="matched no"):
        apply_lora(torch.nn.Sequential(torch.nn.Linear(2, 2)), LoraConfig(rank=2))


def _set_b(model, tp: int, rank: int) -> None:
    """Give every lora_B the slice of one full random matrix (the same for every TP layout)."""
    import zlib

    from loong_llm.lora import _STATE

    with torch.no_grad():
        for name, module in model.named_modules():
            state = getattr(module, _STATE, None)
            if state is None:
                continue
            out_local, r = module.lora_B.weight.shape
            full_out = out_local * tp if state["kind"] == "column" else out_local
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            full = torch.randn(full_out, r, generator=g) * 0.05
            if name.endswith("linear_fc1"):  # SwiGLU: each rank holds [gate_i; up_i]
                half = out_local // 2
                full = torch.cat([h[rank * half: (rank + 1) * half] for h in full.chunk(2)])
            elif state["kind"] == "column":  # qkv rows are grouped by query group per rank
                full = full[rank * out_local: (rank + 1) * out_local]
            module.lora_B.weight.copy_(full)


def _tp2_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from loong_core.devices.select import select_device

    select_device("cpu").setup()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    from loong_llm.families.llama.config import LlamaConfig
    from loong_llm.families.llama.model import LlamaProvider

    torch.manual_seed(0)
    provider = LlamaProvider(LlamaConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                         num_query_groups=2, ffn_hidden_size=128, vocab_size=96,
                                         max_position_embeddings=256))
    model = provider.build_megatron_model(
        provider.megatron_config({"tensor_model_parallel_size": 2}), True, True, None)
    tokens, positions = batch(1)
    with torch.no_grad():
        base = model(tokens, positions, None)
    apply_lora(model, LoraConfig(rank=4, alpha=8))
    _set_b(model, 2, rank)
    logits = model(tokens, positions, None)
    logits.float().sum().backward()
    grads = {n: p.grad.clone() for n, p in lora_parameters(model).items()}
    with torch.no_grad():
        gathered = [torch.empty_like(logits) for _ in range(2)]
        dist.all_gather(gathered, logits.detach().contiguous())
        adapted = torch.cat(gathered, dim=-1)
        merge_lora(model)
        merged_local = model(tokens, positions, None)
        dist.all_gather(gathered, merged_local.contiguous())
        merged = torch.cat(gathered, dim=-1)
        dist.all_gather(gathered, base.contiguous())
        base = torch.cat(gathered, dim=-1)
    if rank == 0:
        torch.save({"base": base, "adapted": adapted, "merged": merged, "grads": grads}, out)
    else:
        torch.save({"grads": grads}, out + ".1")
    dist.destroy_process_group()


@pytest.mark.multirank
def test_tensor_parallel_adapters_match_one_rank(mcore_single_rank, tmp_path):
    import inspect
    import subprocess
    import sys

    # Two fresh processes run this module's helpers (a test module is not importable by name).
    script = tmp_path / "tp2_worker.py"
    script.write_text("\n".join([
        "import sys, torch",
        "from loong_llm.lora import LoraConfig, apply_lora, lora_parameters, merge_lora",
        *(inspect.getsource(f) for f in (batch, _set_b, _tp2_worker)),
        "_tp2_worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])",
    ]))
    out, port = str(tmp_path / "tp2.pt"), str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, out],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    logs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), logs[0][-3000:] + logs[1][-3000:]
    tp2, tp2_rank1 = torch.load(out), torch.load(out + ".1")
    model = tiny_llama()
    tokens, positions = batch(1)
    with torch.no_grad():
        base = model(tokens, positions, None)
    apply_lora(model, LoraConfig(rank=4, alpha=8))
    _set_b(model, 1, 0)
    with torch.no_grad():
        ref = model(tokens, positions, None)
    print(f"base TP2 vs TP1 {(tp2['base'] - base).abs().max().item():.3e}")
    diff = (tp2["adapted"] - ref).abs().max().item()
    print(f"LoRA TP2 vs TP1 logits: max abs diff {diff:.3e}; TP2 merged vs adapted "
          f"{(tp2['merged'] - tp2['adapted']).abs().max().item():.3e}")
    assert diff < 1e-4
    assert (tp2["merged"] - tp2["adapted"]).abs().max() < 1e-4
    for name, grad in tp2["grads"].items():  # replicated adapters get the same gradient on both ranks
        if tuple(grad.shape) == tuple(tp2_rank1["grads"][name].shape) and (
                ("linear_qkv.lora_A" in name) or ("linear_fc1.lora_A" in name)
                or ("linear_proj.lora_B" in name) or ("linear_fc2.lora_B" in name)):
            assert torch.allclose(grad, tp2_rank1["grads"][name], atol=1e-5), name
