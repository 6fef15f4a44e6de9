"""The ``llm`` plugin: registers names only; nothing heavy is imported here."""

from __future__ import annotations

from loong_core.hookspecs import hookimpl

_F = "loong_llm.families"

# name -> (provider class, config class, HF adapter class, description)
FAMILIES = {
    "llama": ("LlamaProvider", "LlamaConfig", "LlamaHFAdapter",
              "Llama 2/3/3.1: RMSNorm, SwiGLU, RoPE (llama3 scaling), GQA"),
    "qwen2": ("Qwen2Provider", "Qwen2Config", "Qwen2HFAdapter",
              "Qwen2/Qwen2.5: Llama-style with qkv bias"),
    "qwen3": ("Qwen3Provider", "Qwen3Config", "Qwen3HFAdapter",
              "Qwen3 dense: Llama-style with q/k RMSNorm"),
    "qwen3_moe": ("Qwen3MoEProvider", "Qwen3MoEConfig", "Qwen3MoEHFAdapter",
                  "Qwen3-MoE: q/k RMSNorm, top-k softmax router, aux-loss balanced experts"),
    "deepseek_v3": ("DeepSeekV3Provider", "DeepSeekV3Config", "DeepSeekV3HFAdapter",
                    "DeepSeek-V3 style: MLA, shared + routed experts, sigmoid router with "
                    "aux-loss-free bias, first dense layers"),
    "deepseek_v32": ("DeepSeekV32Provider", "DeepSeekV32Config", "DeepSeekV32HFAdapter",
                     "DeepSeek-V3.2: DeepSeek-V3 with DeepSeek sparse attention (lightning indexer, "
                     "top-k keys per query, indexer KL loss)"),
    "deepseek_v2": ("DeepSeekV2Provider", "DeepSeekV2Config", "DeepSeekV2HFAdapter",
                    "DeepSeek-V2 / V2-Lite: MLA (full query projection without q_lora_rank), "
                    "shared + softmax-routed experts (no expert bias), first dense layers"),
    "glm4_moe": ("Glm4MoEProvider", "Glm4MoEConfig", "Glm4MoEHFAdapter",
                 "GLM-4.5/4.6: GQA with qkv bias and q/k RMSNorm, RoPE on half of each head, "
                 "first dense layers, shared + sigmoid-routed experts with expert bias"),
    "qwen3_next": ("Qwen3NextProvider", "Qwen3NextConfig", "Qwen3NextHFAdapter",
                   "Qwen3-Next: Gated DeltaNet linear attention and gated full attention (3:1), "
                   "softmax-routed experts with a sigmoid-gated shared expert, zero-centred norms"),
    "qwen3_5": ("Qwen3_5Provider", "Qwen3_5Config", "Qwen3_5HFAdapter",
                "Qwen3.5 text (dense): Qwen3-Next's Gated DeltaNet + gated attention stack, dense MLPs"),
    "qwen3_5_moe": ("Qwen3_5MoEProvider", "Qwen3_5MoEConfig", "Qwen3_5MoEHFAdapter",
                    "Qwen3.5-MoE text: Qwen3-Next's model with Qwen3.5's checkpoint layout"),
    "minimax_m2": ("MiniMaxM2Provider", "MiniMaxM2Config", "MiniMaxM2HFAdapter",
                   "MiniMax-M2: GQA with whole-projection q/k RMSNorm, partial RoPE, every layer "
                   "sigmoid-routed experts with expert bias, no shared expert"),
}


@hookimpl
def loong_register_models(register):
    for name, (provider, config, _, description) in FAMILIES.items():
        register(name, f"{_F}.{name}.model:{provider}", config=f"{_F}.{name}.config:{config}",
                 engines=("megatron",), description=description)


@hookimpl
def loong_register_checkpoint_adapters(register):
    for name, (_, _, adapter, _) in FAMILIES.items():
        register(name, f"{_F}.{name}.hf_adapter:{adapter}",
                 description=f"Hugging Face <-> loong for the '{name}' family")


@hookimpl
def loong_register_datasets(register):
    register("text", "loong_llm.data.text_data:TextDataModule",
             config="loong_llm.data.config:TextDataConfig",
             description="plain-text corpus -> BPE tokenizer -> megatron indexed dataset")
    register("indexed", "loong_llm.data.indexed_data:IndexedDataModule",
             config="loong_llm.data.config:IndexedDataConfig",
             description="a dataset written by `loong data preprocess` (PREFIX.bin/.idx)")
    register("chat", "loong_llm.data.chat_data:ChatDataModule",
             config="loong_llm.data.config:ChatDataConfig",
             description="chat jsonl / built-in chat corpus: chat template, assistant-only loss, packing")


@hookimpl
def loong_register_cli_commands(register):
    register("data preprocess", "loong_llm.cli.data_cmd:add_parser",
             description="text / jsonl / parquet -> megatron-core indexed dataset")
    register("convert", "loong_llm.cli.convert_cmd:add_parser",
             description="convert checkpoints between Hugging Face and loong")
    register("generate", "loong_llm.cli.infer_cmd:add_generate_parser",
             description="greedy generation from an HF directory or a loong checkpoint")
    register("eval perplexity", "loong_llm.cli.infer_cmd:add_perplexity_parser",
             description="perplexity of a text file")


@hookimpl
def loong_register_default_experiments(register):
    register("llama_shakespeare", priority=10)


@hookimpl
def loong_config_search_path():
    return "pkg://loong_llm.conf"
