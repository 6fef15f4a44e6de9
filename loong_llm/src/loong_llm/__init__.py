"""loong LLM plugin: Llama-style foundations on megatron-core, text corpora and tokenizers."""

__version__ = "0.1.0"
