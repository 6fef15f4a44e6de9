"""The ``llm`` plugin: registers names only; nothing heavy is imported here."""

from __future__ import annotations

from loong_core.hookspecs import hookimpl


@hookimpl
def loong_register_models(register):
    register("llama", "loong_llm.families.llama.model:LlamaProvider",
             config="loong_llm.families.llama.config:LlamaConfig", engines=("megatron",),
             description="Llama-style decoder: RMSNorm, SwiGLU, RoPE, GQA")


@hookimpl
def loong_register_datasets(register):
    register("text", "loong_llm.data.text_data:TextDataModule",
             config="loong_llm.data.config:TextDataConfig",
             description="plain-text corpus -> BPE tokenizer -> megatron indexed dataset")


@hookimpl
def loong_register_default_experiments(register):
    register("llama_shakespeare", priority=10)


@hookimpl
def loong_config_search_path():
    return "pkg://loong_llm.conf"
