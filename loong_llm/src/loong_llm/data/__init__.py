"""Text data: built-in corpora, byte-level BPE tokenizer, megatron-core indexed datasets.

Names load lazily, so ``import loong_llm.data.config`` stays free of torch, numpy and
``tokenizers``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TextDataConfig": "loong_llm.data.config",
    "CORPORA": "loong_llm.data.corpus",
    "load_shakespeare": "loong_llm.data.corpus",
    "split_documents": "loong_llm.data.corpus",
    "TextTokenizer": "loong_llm.data.tokenizer",
    "train_bpe": "loong_llm.data.tokenizer",
    "EpochDataset": "loong_llm.data.indexed",
    "build_gpt_epochs": "loong_llm.data.indexed",
    "indexed_dataset_exists": "loong_llm.data.indexed",
    "write_indexed_dataset": "loong_llm.data.indexed",
    "TextDataModule": "loong_llm.data.text_data",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
