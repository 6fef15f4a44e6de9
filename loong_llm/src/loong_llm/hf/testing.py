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
        tokens, reference = expected[hf_dir.name]
        seq = tokens.shape[1]
        positions = torch.arange(seq).expand(2, seq)

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
        torch.distributed.all_reduce(diff, op=torch.distributed.ReduceOp.MAX)
        results[hf_dir.name] = diff.item()
        ps.destroy_model_parallel()
    if torch.distributed.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(parity_main())
