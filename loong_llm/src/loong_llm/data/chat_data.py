"""The ``chat`` dataset: supervised fine-tuning on conversations, loss on assistant tokens only.

``prepare`` renders every conversation with the tokenizer's chat template, tokenizes it and writes
two megatron-core indexed datasets per split into the cache: ``<split>`` (token ids) and
``<split>_loss`` (1 where the token belongs to an assistant reply). ``build`` serves samples of
``seq_length`` positions, several conversations packed per sample by default
(:mod:`loong_llm.data.packing`), reshuffled every epoch from ``(seed, split, epoch)``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from loong_core.config.compose import cache_root
from loong_core.errors import ConfigError, LoongError
from loong_llm.data.chat import (
    CHAT_CORPORA,
    CHATML_TEMPLATE,
    CHATML_TOKENS,
    read_chat_jsonl,
    tokenize_conversation,
)
from loong_llm.data.config import ChatDataConfig
from loong_llm.data.corpus import split_documents
from loong_llm.data.indexed import indexed_dataset_exists, write_indexed_dataset

logger = logging.getLogger(__name__)

PIPELINE_VERSION = 1
SPLITS = ("train", "valid")


def _sha256_path(path: str) -> str:
    digest = hashlib.sha256()
    files = sorted(Path(path).rglob("*")) if os.path.isdir(path) else [Path(path)]
    for f in files:
        if f.is_file():
            digest.update(f.name.encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()


def train_chat_tokenizer(conversations, vocab_size: int):
    """A byte-level BPE trained on the message texts, with the ChatML template and its tokens."""
    from loong_llm.data.tokenizer import TextTokenizer, train_bpe

    texts = (m["content"] for conv in conversations for m in conv)
    bpe = train_bpe(texts, vocab_size - len(CHATML_TOKENS))
    bpe.tokenizer.add_special_tokens(list(CHATML_TOKENS))
    return TextTokenizer(bpe.tokenizer, chat_template=CHATML_TEMPLATE,
                         template_tokens={"eos_token": "<|im_end|>"})


class ChatSFTDataset:
    """Map-style SFT samples over the tokenized conversations of one split.

    Args:
        prefix: Indexed dataset of token ids; ``<prefix>_loss`` holds the assistant masks.
        seq_length: Positions per sample.
        pad_id: Token id at padded positions.
        pack: Pack conversations (with a block-diagonal attention mask) or one per sample.
        pack_algorithm: ``best_fit`` or ``next_fit`` (:func:`loong_llm.data.packing.pack`).
        num_samples: At least this many samples (whole epochs).
        seed: Base seed of the per-epoch shuffles.
        split: ``train`` or ``valid`` (part of the shuffle seed).
    """

    def __init__(self, prefix: str, seq_length: int, pad_id: int, pack: bool, num_samples: int,
                 seed: int, split: str, pack_algorithm: str = "best_fit"):
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        from loong_llm.data.packing import pack as pack_items

        self.ids = IndexedDataset(prefix)
        self.loss = IndexedDataset(f"{prefix}_loss")
        self.seq_length, self.pad_id, self.pack = seq_length, pad_id, pack
        sizes = np.minimum(self.ids.sequence_lengths.astype(np.int64), seq_length + 1) - 1
        usable = np.flatnonzero(sizes >= 1)
        if usable.size == 0:
            raise LoongError(f"{split}: no conversation of at least 2 tokens in {prefix}")
        self.samples: list[list[int]] = []
        epoch = 0
        while epoch == 0 or len(self.samples) < num_samples:
            rng = np.random.default_rng([seed % 2**63, SPLITS.index(split), epoch])
            order = usable[rng.permutation(usable.size)]
            if pack:
                bins = pack_items(sizes[order].tolist(), seq_length, pack_algorithm, rng)
                self.samples.extend([int(order[j]) for j in b] for b in bins)
            else:
                self.samples.extend([int(d)] for d in order)
            epoch += 1
        self.num_epochs = epoch

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> dict:
        from loong_llm.data.packing import packed_sample

        docs = [(np.asarray(self.ids[d], dtype=np.int64), np.asarray(self.loss[d], dtype=np.float32))
                for d in self.samples[int(idx)]]
        return packed_sample(docs, self.seq_length, self.pad_id, with_mask=self.pack)


class ChatDataModule:
    """SFT samples from chat conversations (implements the ``loong_core`` ``DataModule``).

    Args:
        config: The validated dataset config.
    """

    config_class = ChatDataConfig

    def __init__(self, config: ChatDataConfig):
        self.config = config
        self.tokenizer = None
        self._data_dir: Path | None = None

    def _source(self) -> tuple[str, str]:
        cfg = self.config
        if cfg.path is not None:
            if not os.path.isfile(cfg.path):
                raise ConfigError(f"data.path = {cfg.path!r} does not exist (a chat jsonl file).")
            return f"jsonl:{cfg.messages_key}", _sha256_path(cfg.path)
        return f"corpus:{cfg.corpus}", CHAT_CORPORA[cfg.corpus][1]()

    @property
    def data_dir(self) -> Path:
        """Cache folder of this config's tokenized conversations."""
        if self._data_dir is None:
            cfg = self.config
            if cfg.tokenizer is not None and not os.path.exists(cfg.tokenizer):
                raise ConfigError(f"data.tokenizer = {cfg.tokenizer!r} does not exist.")
            source, version = self._source()
            key = {"pipeline": PIPELINE_VERSION, "source": source, "version": version,
                   "tokenizer": _sha256_path(cfg.tokenizer) if cfg.tokenizer else cfg.vocab_size,
                   "valid_fraction": cfg.valid_fraction}
            digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
            name = Path(cfg.path).stem if cfg.path else cfg.corpus
            self._data_dir = cache_root(cfg.cache_dir) / "chat" / f"{name}-{digest}"
        return self._data_dir

    def _load(self) -> list:
        cfg = self.config
        if cfg.path is not None:
            return list(read_chat_jsonl(cfg.path, cfg.messages_key))
        return CHAT_CORPORA[cfg.corpus][0]()

    def is_prepared(self) -> bool:
        """Whether every file ``prepare`` writes is complete (``meta.json`` is written last)."""
        return (self.data_dir / "meta.json").is_file()

    def prepare(self) -> None:
        """Tokenize the conversations into the cache (idempotent, atomic per file)."""
        from loong_llm.data.hf_tokenizer import load_tokenizer, save_tokenizer_dir

        if self.is_prepared():
            return
        cfg, d = self.config, self.data_dir
        start = time.perf_counter()
        conversations = self._load()
        names = [f"{i:09d}" for i in range(len(conversations))]
        split_names = dict(zip(SPLITS, split_documents(names, cfg.valid_fraction)))
        if cfg.tokenizer:
            tokenizer = load_tokenizer(cfg.tokenizer)
        else:
            tokenizer = train_chat_tokenizer([conversations[int(n)] for n in split_names["train"]],
                                             cfg.vocab_size)
        save_tokenizer_dir(tokenizer, d / "tokenizer")
        meta: dict[str, Any] = {"conversations": len(conversations), "vocab_size": tokenizer.vocab_size}
        for split in SPLITS:
            encoded = [tokenize_conversation(tokenizer, conversations[int(n)]) for n in split_names[split]]
            write_indexed_dataset(d / f"{split}_loss", [m for _, m in encoded], tokenizer.vocab_size)
            write_indexed_dataset(d / split, [ids for ids, _ in encoded], tokenizer.vocab_size)
            meta[f"{split}_conversations"] = len(encoded)
            meta[f"{split}_tokens"] = sum(len(ids) for ids, _ in encoded)
            meta[f"{split}_assistant_tokens"] = sum(sum(m) for _, m in encoded)
        tmp = d / f".meta.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, d / "meta.json")
        logger.info("Prepared %d conversations in %.1f s -> %s (%s)", len(conversations),
                    time.perf_counter() - start, d, meta)

    def metadata(self) -> dict[str, Any]:
        """Contents of ``meta.json``."""
        return json.loads((self.data_dir / "meta.json").read_text(encoding="utf-8"))

    def inference_files(self) -> dict[str, Path]:
        """The tokenizer folder (with its chat template), copied into ``RUN/data/tokenizer/``."""
        return {"tokenizer": self.data_dir / "tokenizer"}

    def setup(self) -> None:
        """Load the tokenizer that ``prepare`` saved."""
        from loong_llm.data.hf_tokenizer import load_tokenizer

        if not self.is_prepared() or not all(indexed_dataset_exists(self.data_dir / s) for s in SPLITS):
            raise LoongError(f"Chat data is not prepared in {self.data_dir}; call prepare() first.")
        self.tokenizer = load_tokenizer(self.data_dir / "tokenizer")

    def model_overrides(self) -> dict[str, Any]:
        """``{"vocab_size": ...}`` of the tokenizer."""
        if self.tokenizer is None:
            self.setup()
        return {"vocab_size": self.tokenizer.vocab_size}

    def build(self, num_train_samples: int, num_valid_samples: int,
              seed: int) -> tuple[ChatSFTDataset, ChatSFTDataset]:
        """Return ``(train, valid)`` SFT datasets of at least that many samples."""
        if self.tokenizer is None:
            self.setup()
        tok = self.tokenizer
        pad = tok.pad if tok.pad >= 0 else tok.eod
        out = [ChatSFTDataset(str(self.data_dir / split), self.config.seq_length, pad, self.config.pack,
                              n, seed, split, self.config.pack_algorithm)
               for split, n in zip(SPLITS, (num_train_samples, num_valid_samples))]
        return out[0], out[1]

    def sample_cost(self, sample: dict) -> float:
        """Positions holding real tokens (packed samples may end in padding)."""
        return float(len(sample["tokens"]))
