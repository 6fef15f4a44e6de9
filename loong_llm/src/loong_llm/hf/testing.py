"""Testing kit for the LLM families: tiny random transformers models of every family (built in
code, no downloads) and a parity check of our model against transformers' logits.

Parity, one process per rank:
``torchrun --nproc-per-node N -m loong_llm.hf.testing OUT.json --tp T --pp P --ep E DIR...``
(each DIR an HF model directory named after its family, or ``FAMILY+VARIANT`` for a variant of
it) writes ``{dir name: relative_diff}``: the largest absolute logit difference divided by the
largest absolute reference logit. The sequence has 16 tokens unless the directory holds a
``loong_parity.json`` asking for more (:func:`set_parity_seq_length`; YaRN past its original
context).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

VOCAB = 256


def hf_config(family: str, **overrides):
    """A transformers config object of ``family`` small enough for CPU tests."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128)
    if family == "llama":
        cfg = tf.LlamaConfig(**common, tie_word_embeddings=False, rms_norm_eps=1e-5,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                              "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 32})
    elif family == "qwen2":
        cfg = tf.Qwen2Config(**common, tie_word_embeddings=True)
    elif family == "qwen3":
        cfg = tf.Qwen3Config(**common, head_dim=32, tie_word_embeddings=True)
    elif family == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**common, head_dim=32, num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=48, norm_topk_prob=True,
                                tie_word_embeddings=False)
    elif family == "deepseek_v3":
        cfg = tf.DeepseekV3Config(**{**common, "num_key_value_heads": 4}, moe_intermediate_size=32,
                                  n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
                                  n_group=2, topk_group=1, routed_scaling_factor=2.5,
                                  first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                  tie_word_embeddings=False, rope_interleave=True)
    elif family == "deepseek_v32":  # index_topk 6 < the 16-token parity sequence: sparse
        cfg = tf.DeepseekV32Config(**{**common, "num_key_value_heads": 4}, moe_intermediate_size=32,
                                   n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
                                   n_group=2, topk_group=1, routed_scaling_factor=2.5,
                                   first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                                   qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                   index_topk=6, index_head_dim=16, index_n_heads=2,
                                   tie_word_embeddings=False)
    elif family == "deepseek_v2":  # V2-Lite-like with q_lora_rank=None as an override
        cfg = tf.DeepseekV2Config(**{**common, "num_key_value_heads": 4}, moe_intermediate_size=32,
                                  n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
                                  topk_method="greedy", routed_scaling_factor=2.5,
                                  first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                  tie_word_embeddings=False)
    elif family == "glm4_moe":
        cfg = tf.Glm4MoeConfig(**common, head_dim=32, attention_bias=True, use_qk_norm=True,
                               moe_intermediate_size=32, n_shared_experts=1, n_routed_experts=4,
                               num_experts_per_tok=2, n_group=2, topk_group=1,
                               routed_scaling_factor=2.5, first_k_dense_replace=1,
                               tie_word_embeddings=False)  # partial_rotary_factor 0.5 (default)
    elif family == "minimax_m2":
        cfg = tf.MiniMaxM2Config(**common, head_dim=32, rotary_dim=16, num_local_experts=4,  # partial RoPE
                                 num_experts_per_tok=2, tie_word_embeddings=False,
                                 bos_token_id=1, eos_token_id=2)
    elif family == "qwen3_next":  # Gated DeltaNet, then gated full attention (partial RoPE 0.25)
        cfg = tf.Qwen3NextConfig(**common, head_dim=32, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                 linear_conv_kernel_dim=4, linear_key_head_dim=16,
                                 linear_value_head_dim=24, linear_num_key_heads=2,
                                 linear_num_value_heads=4, tie_word_embeddings=False,
                                 layer_types=["linear_attention", "full_attention"])
    elif family in ("qwen3_5", "qwen3_5_moe"):  # text models: Qwen3-Next's stack, split projections
        hybrid = dict(head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                      linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
                      tie_word_embeddings=False, layer_types=["linear_attention", "full_attention"])
        if family == "qwen3_5":
            cfg = tf.Qwen3_5TextConfig(**common, **hybrid)
        else:
            cfg = tf.Qwen3_5MoeTextConfig(**{k: v for k, v in common.items() if k != "intermediate_size"},
                                          **hybrid, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=32, shared_expert_intermediate_size=48)
    else:
        raise ValueError(family)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def bf16_copy(hf_dir: Path, directory: Path) -> Path:
    """Copy an HF directory with its floating-point tensors cast to bf16 (as published
    checkpoints are) and ``config.json``'s dtype set accordingly."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(hf_dir, directory)
    for path in sorted(Path(directory).glob("*.safetensors")):
        tensors = load_file(path)
        save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()},
                  path, metadata={"format": "pt"})
    config_path = Path(directory) / "config.json"
    config = json.loads(config_path.read_text())
    for key in ("torch_dtype", "dtype"):
        if key in config:
            config[key] = "bfloat16"
    config_path.write_text(json.dumps(config, indent=2))
    return Path(directory)


def convert_round_trip(family: str, hf_dir: Path, workdir: Path, *layout: str) -> dict:
    """HF -> loong (at ``layout``, e.g. ``--ep 2``) -> HF through ``loong convert``, asserting the
    same tensor names, values and dtypes (single-file models) and the same ``config.json``.

    Returns:
        The tensors that came back, for the caller's family-specific checks.
    """
    import subprocess

    import torch
    from safetensors.torch import load_file

    hf_dir, workdir = Path(hf_dir), Path(workdir)
    for args in (["hf-to-loong", "--family", family, *layout, str(hf_dir), str(workdir / "ckpt")],
                 ["loong-to-hf", str(workdir / "ckpt"), str(workdir / "back")]):
        result = subprocess.run([sys.executable, "-m", "loong_core.cli.main", "convert", *args], capture_output=True,
                                text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr[-6000:]
    source, back = load_file(hf_dir / "model.safetensors"), load_file(workdir / "back" / "model.safetensors")
    assert set(source) == set(back), sorted(set(source) ^ set(back))[:10]
    assert all(torch.equal(source[n], back[n]) and source[n].dtype == back[n].dtype for n in source)
    config = json.loads((hf_dir / "config.json").read_text())
    assert json.loads((workdir / "back" / "config.json").read_text()) == config
    return back


def write_hf_model(family: str, directory: Path, seed: int = 0, dtype=None, **overrides) -> Path:
    """Save a randomly initialised model of ``family`` (std 0.1 so logits are not flat)."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(hf_config(family, **overrides))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))  # non-trivial norms
            else:
                p.normal_(0.0, 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # aux-loss-free balancing bias
                b.copy_(0.1 * torch.randn_like(b))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(directory)
    return directory

def add_mtp_layers(hf_dir: Path, depth: int = 1, seed: int = 1) -> Path:
    """Give an HF directory of an MTP family (DeepSeek-V3, GLM-4.5) ``depth`` random
    multi-token-prediction layers as those checkpoints store them (transformers drops them):
    ``model.layers.{N+k}.`` ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm``, a decoder
    layer of the family (transformers' own class) and copies of the embedding and output head
    (``embed_tokens``, ``shared_head.head``), in ``mtp.safetensors``; config.json gets
    ``num_nextn_predict_layers``."""
    import torch
    import transformers as tf
    from safetensors.torch import load_file, save_file

    hf_dir = Path(hf_dir)
    config = tf.AutoConfig.from_pretrained(hf_dir)
    main = {}
    for path in sorted(hf_dir.glob("*.safetensors")):
        main.update(load_file(path))
    dtype = main["model.embed_tokens.weight"].dtype
    head = main.get("lm_head.weight", main["model.embed_tokens.weight"])
    layer_cls = type(tf.AutoModelForCausalLM.from_config(config).model.layers[-1])
    _extend_layer_types(config, depth)
    torch.manual_seed(seed)
    tensors, h = {}, config.hidden_size
    for k in range(depth):
        n = config.num_hidden_layers + k
        layer = layer_cls(config, n)
        weights = {f"{name}": p for name, p in layer.state_dict().items()}
        weights.update({"enorm.weight": torch.empty(h), "hnorm.weight": torch.empty(h),
                        "shared_head.norm.weight": torch.empty(h), "eh_proj.weight": torch.empty(h, 2 * h)})
        for name, value in weights.items():
            if name.endswith("correction_bias"):
                value = 0.1 * torch.randn(value.shape)
            elif "norm" in name:
                value = 1.0 + 0.1 * torch.randn(value.shape)
            else:
                value = 0.1 * torch.randn(value.shape)
            tensors[f"model.layers.{n}.{name}"] = value.to(dtype).contiguous()
        _split_fused_experts(tensors, f"model.layers.{n}.mlp.experts.")
        tensors[f"model.layers.{n}.embed_tokens.weight"] = main["model.embed_tokens.weight"].clone()
        tensors[f"model.layers.{n}.shared_head.head.weight"] = head.clone()
    save_file(tensors, hf_dir / "mtp.safetensors", metadata={"format": "pt"})
    config_path = hf_dir / "config.json"
    hf = json.loads(config_path.read_text())
    hf["num_nextn_predict_layers"] = depth
    config_path.write_text(json.dumps(hf, indent=2))
    return hf_dir


def _extend_layer_types(config, depth: int) -> None:
    """Let transformers' decoder-layer class be built at the MTP indices ``num_hidden_layers +
    k``: a config with per-layer lists (DeepSeek-V3.2's ``mlp_layer_types``) gets ``depth`` more
    entries, each a copy of the last layer's (an MTP layer is built like the last decoder layer)."""
    for key in ("mlp_layer_types",):
        types = getattr(config, key, None)
        if types and len(types) == config.num_hidden_layers:
            setattr(config, key, [*types, *[types[-1]] * depth])


def _split_fused_experts(tensors: dict, prefix: str) -> None:
    """transformers' fused expert parameters (``gate_up_proj [E, 2I, H]``, ``down_proj
    [E, H, I]``) under ``prefix`` as checkpoints store them, one ``experts.{e}.*_proj.weight``
    each (what ``save_pretrained`` writes)."""
    gate_up, down = tensors.pop(prefix + "gate_up_proj", None), tensors.pop(prefix + "down_proj", None)
    if gate_up is None:
        return
    for e, (gu, d) in enumerate(zip(gate_up, down)):
        gate, up = gu.chunk(2, dim=0)
        for name, value in (("gate_proj", gate), ("up_proj", up), ("down_proj", d)):
            tensors[f"{prefix}{e}.{name}.weight"] = value.contiguous()


def _fuse_experts(tensors: dict, layer) -> dict:
    """The inverse of :func:`_split_fused_experts` where ``layer`` has fused experts."""
    import torch

    state = layer.state_dict()
    if "mlp.experts.gate_up_proj" not in state:
        return tensors
    count = state["mlp.experts.gate_up_proj"].shape[0]
    part = {n: t for n, t in tensors.items() if not n.startswith("mlp.experts.")}
    part["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([tensors[f"mlp.experts.{e}.gate_proj.weight"],
                    tensors[f"mlp.experts.{e}.up_proj.weight"]]) for e in range(count)])
    part["mlp.experts.down_proj"] = torch.stack(
        [tensors[f"mlp.experts.{e}.down_proj.weight"] for e in range(count)])
    return part


def mtp_depth(hf_dir: Path) -> int:
    """MTP layers stored in an HF directory (0: none)."""
    from loong_llm.hf.io import SafetensorsReader

    layers = json.loads((Path(hf_dir) / "config.json").read_text())["num_hidden_layers"]
    keys, depth = set(SafetensorsReader(hf_dir).keys()), 0
    while f"model.layers.{layers + depth}.eh_proj.weight" in keys:
        depth += 1
    return depth


def mtp_reference_logits(model, hf_dir: Path, tokens) -> list:
    """Logits ``[b, s, v]`` of each MTP depth of ``hf_dir`` from transformers' modules: depth
    ``k`` takes the previous depth's output (the decoder's normed output for the first),
    ``RMSNorm``-ed, next to the normed embedding of the tokens shifted by ``k + 1``, through
    ``eh_proj``, one decoder layer (causal, positions ``0..s-1``), ``shared_head.norm`` and the
    output head (positions whose shifted token is past the end hold no prediction)."""
    import copy

    import torch
    from safetensors.torch import load_file

    cfg = copy.deepcopy(model.config)
    _extend_layer_types(cfg, mtp_depth(hf_dir))
    weights = load_file(Path(hf_dir) / "mtp.safetensors")
    norm_cls, layer_cls = type(model.model.norm), type(model.model.layers[-1])
    b, s = tokens.shape
    positions = torch.arange(s).expand(b, s)
    causal = torch.full((s, s), float("-inf")).triu(1).expand(b, 1, s, s)
    with torch.no_grad():
        hidden = model.model(tokens).last_hidden_state
        out = []
        for k in range(mtp_depth(hf_dir)):
            prefix = f"model.layers.{cfg.num_hidden_layers + k}."
            part = {n[len(prefix):]: t.float() for n, t in weights.items() if n.startswith(prefix)}
            enorm, hnorm, final = (norm_cls(cfg.hidden_size, eps=cfg.rms_norm_eps) for _ in range(3))
            for name, module in (("enorm", enorm), ("hnorm", hnorm), ("shared_head.norm", final)):
                module.load_state_dict({"weight": part[name + ".weight"]})
            layer = layer_cls(cfg, cfg.num_hidden_layers + k)
            state = _fuse_experts(part, layer)
            layer.load_state_dict({n: t for n, t in state.items() if n in layer.state_dict()})
            shifted = torch.roll(tokens, -(k + 1), dims=1)
            x = torch.cat([enorm(model.model.embed_tokens(shifted)), hnorm(hidden)], -1)
            x = x @ part["eh_proj.weight"].T
            x = layer(x, attention_mask=causal, position_ids=positions,
                      position_embeddings=model.model.rotary_emb(x, positions))
            hidden = final(x)
            out.append(hidden @ part["shared_head.head.weight"].T)
    return out


def mtp_loss_diff(model, tokens, positions, mtp_reference: list) -> float:
    """Relative difference of the MTP loss a training forward of ``model`` records
    (``SeamGPTModel.mtp_last_loss``: labels the next tokens, the last position masked) and the
    cross entropy of the reference logits of each depth ``k`` at the positions whose target,
    token ``i + 2 + k``, lies in the sequence (one pipeline stage)."""
    import torch

    seq = tokens.shape[1]
    labels, mask = torch.roll(tokens, -1, dims=1), torch.ones(tokens.shape)
    mask[:, -1] = 0
    model.train()
    with torch.no_grad():
        model(tokens, positions, None, labels=labels, loss_mask=mask)
    model.eval()
    total, count = model.mtp_last_loss
    ref_total, ref_count = 0.0, 0
    for k, logits in enumerate(mtp_reference):
        n = seq - 2 - k
        target = tokens[:, 2 + k: 2 + k + n]
        logp = logits[:, :n].float().log_softmax(-1)
        ref_total -= logp.gather(-1, target[..., None]).sum().item()
        ref_count += target.numel()
    assert count.item() == ref_count, (count.item(), ref_count)
    want = ref_total / ref_count
    return abs(total.item() / count.item() - want) / want


PARITY_FILE = "loong_parity.json"


def set_parity_seq_length(hf_dir: Path, seq_length: int) -> Path:
    """Ask the parity check for ``seq_length`` tokens on ``hf_dir`` (default 16)."""
    (Path(hf_dir) / PARITY_FILE).write_text(json.dumps({"seq_length": seq_length}))
    return Path(hf_dir)


def parity_seq_length(hf_dir: Path) -> int:
    """The sequence length of the parity check of ``hf_dir``."""
    path = Path(hf_dir) / PARITY_FILE
    return json.loads(path.read_text())["seq_length"] if path.exists() else 16


def parity_main(argv: list[str] | None = None) -> int:
    """One rank of a parity check (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    args = parser.parse_args(argv)

    import torch
    import transformers as tf

    from loong_core.config.schema import ParallelConfig
    from loong_core.devices.cpu import CPUBackend

    # Reference logits first, before any megatron-core state exists in this process.
    expected = {}
    for hf_dir in map(Path, args.dirs):
        ref = tf.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        tokens = torch.randint(0, ref.config.vocab_size, (2, parity_seq_length(hf_dir)),
                               generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            expected[hf_dir.name] = (tokens, ref(tokens).logits)
        if mtp_depth(hf_dir):  # compared with the main logits, each depth where it predicts
            expected[hf_dir.name] += tuple(mtp_reference_logits(ref, hf_dir, tokens))

    CPUBackend(int(os.environ.get("LOCAL_RANK", 0)), num_threads=1).setup()
    torch.distributed.init_process_group("gloo")
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from loong_core.engines.megatron import parallel
    from loong_core.plugins import get_plugin_system

    registry = get_plugin_system().registry()
    p = ParallelConfig(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                       expert_model_parallel_size=args.ep)
    results = {}
    for hf_dir in map(Path, args.dirs):
        family = hf_dir.name.split("+")[0]
        entry = registry.get("model", family)
        cfg = entry.load_meta("config")(name=family, init_from_hf=str(hf_dir))
        provider = entry.load()(cfg)
        parallel.initialize(p, seed=1234)
        mcfg = provider.megatron_config(parallel.transformer_kwargs(p))
        model = provider.build_megatron_model(mcfg, ps.is_pipeline_first_stage(),
                                              ps.is_pipeline_last_stage(), None)
        provider.initialize_weights([model])
        model.eval()
        tokens, reference, *mtp_reference = expected[hf_dir.name]
        seq = tokens.shape[1]
        positions = torch.arange(seq).expand(2, seq)
        mtp_hidden = []
        if mtp_reference and ps.is_pipeline_last_stage():
            model.mtp.register_forward_hook(lambda _m, _i, out, seen=mtp_hidden: seen.append(out))

        def step(_it, m, tokens=tokens, positions=positions):
            out = m(tokens, positions, None)

            def keep(output, non_loss_data=False):
                return output

            return out, keep

        with torch.no_grad():
            out = get_forward_backward_func()(
                forward_step_func=step, data_iterator=iter([None]), model=[model],
                num_microbatches=1, seq_length=seq, micro_batch_size=2, forward_only=True,
                collect_non_loss_data=True)
        diff = torch.zeros(1, dtype=torch.float64)
        if ps.is_pipeline_last_stage():
            logits = gather_from_tensor_model_parallel_region(out[0])[..., : cfg.vocab_size]
            diff[0] = ((logits.float() - reference).abs().max() / reference.abs().max()).double()
            if mtp_reference:
                depths = torch.chunk(mtp_hidden[0], 1 + len(mtp_reference), dim=0)[1:]
                weight = model.output_weight() if model.share_embeddings_and_output_weights else None
                for k, (hidden, want) in enumerate(zip(depths, mtp_reference)):
                    got, _ = model.output_layer(hidden, weight=weight)
                    got = gather_from_tensor_model_parallel_region(got).transpose(0, 1)
                    got, want = got[:, : seq - 1 - k, : cfg.vocab_size], want[:, : seq - 1 - k]
                    mtp_diff = (got.float() - want).abs().max() / want.abs().max()
                    diff[0] = max(diff[0], mtp_diff.double())
        # and the logged MTP loss is these logits' cross entropy (a training forward: MoE
        # with TP trains only with sequence parallelism, which parity leaves off)
        if mtp_reference and ps.get_tensor_model_parallel_world_size() == 1:
            diff[0] = max(diff[0], mtp_loss_diff(model, tokens, positions, mtp_reference))
        torch.distributed.all_reduce(diff, op=torch.distributed.ReduceOp.MAX)
        results[hf_dir.name] = diff.item()
        ps.destroy_model_parallel()
    if torch.distributed.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(parity_main())
