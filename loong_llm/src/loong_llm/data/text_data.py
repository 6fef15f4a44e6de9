"""Text data module: corpus -> byte-level BPE -> megatron-core indexed datasets -> GPTDataset.

Prepared files live in ``<cache>/text/<corpus>-v<vocab>-<hash>/`` (``<cache>`` is
``data.cache_dir``, ``$LOONG_CACHE`` or ``~/.cache/loong``)::

    tokenizer.json           trained on the train documents only
    train.bin / train.idx    one sequence per train document, each ending in <|endoftext|>
    valid.bin / valid.idx    the held-out documents
    meta.json                document names and token counts per split; written last
    index_cache/             megatron-core GPTDataset sample/shuffle indices (built by build())

The hash covers everything that changes those files (corpus and its version, vocabulary,
validation fraction, tokenizer file contents), so two configs never share a folder by mistake.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from loong_core.config.compose import cache_root
from loong_core.data.manifest import check_cache, write_manifest
from loong_core.errors import ConfigError, LoongError
from loong_llm.data.config import TextDataConfig
from loong_llm.data.corpus import CORPORA, split_documents
from loong_llm.data.indexed import (
    EpochDataset,
    build_gpt_epochs,
    indexed_dataset_exists,
    tokenize_documents,
    write_indexed_dataset,
)
from loong_llm.data.tokenizer import TextTokenizer, train_bpe

logger = logging.getLogger(__name__)

#: Bump when the files ``prepare`` writes change for the same config.
PIPELINE_VERSION = 1
SPLITS = ("train", "valid")


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class TextDataModule:
    """Language-modelling samples from a text corpus (implements ``loong_core`` ``DataModule``).

    Args:
        config: The validated dataset config.
    """

    config_class = TextDataConfig

    def __init__(self, config: TextDataConfig):
        self.config = config
        self.tokenizer: TextTokenizer | None = None
        self._data_dir: Path | None = None

    @property
    def data_dir(self) -> Path:
        """Folder of this config's prepared files (the same on every rank)."""
        if self._data_dir is None:
            cfg = self.config
            tok_file = cfg.tokenizer_file
            if tok_file is not None and not os.path.isfile(tok_file):
                raise ConfigError(f"data.tokenizer_file = {tok_file!r} does not exist.")
            key = {
                "pipeline": PIPELINE_VERSION,
                "corpus": cfg.corpus,
                "corpus_version": CORPORA[cfg.corpus].version(),
                "vocab_size": None if tok_file else cfg.vocab_size,
                "valid_fraction": cfg.valid_fraction,
                "tokenizer_sha256": _sha256_file(tok_file) if tok_file else None,
            }
            digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
            vocab = "file" if tok_file else str(cfg.vocab_size)
            self._data_dir = cache_root(cfg.cache_dir) / "text" / f"{cfg.corpus}-v{vocab}-{digest}"
        return self._data_dir

    def inference_files(self) -> dict[str, Path]:
        """The tokenizer, copied into the run directory (``RUN/data/tokenizer/``)."""
        return {"tokenizer/tokenizer.json": self.data_dir / "tokenizer.json"}

    def is_prepared(self) -> bool:
        """Whether every file ``prepare`` writes is complete."""
        d = self.data_dir
        return (
            (d / "meta.json").is_file()
            and (d / "tokenizer.json").is_file()
            and all(indexed_dataset_exists(d / s) for s in SPLITS)
        )

    def prepare(self) -> None:
        """Tokenize the corpus into the cache; does nothing when already complete.

        Every file is written under a temporary name and renamed into place, and each step is
        skipped when its output exists, so an interrupted run resumes where it stopped.
        """
        if self.is_prepared() and check_cache(self.data_dir, "text data"):
            logger.info("Text data already prepared in %s", self.data_dir)
            return
        cfg, d = self.config, self.data_dir
        start = time.perf_counter()
        d.mkdir(parents=True, exist_ok=True)
        docs = dict(CORPORA[cfg.corpus].load())
        names = {}
        names["train"], names["valid"] = split_documents(sorted(docs), cfg.valid_fraction)
        tokenizer = self._prepare_tokenizer([docs[n] for n in names["train"]])
        tokens = {}
        for split in SPLITS:
            prefix = d / split
            if indexed_dataset_exists(prefix):
                tokens[split] = self._count_tokens(prefix)
                continue
            ids = tokenize_documents(tokenizer, [docs[n] for n in names[split]])
            tokens[split] = write_indexed_dataset(prefix, ids, tokenizer.vocab_size, tokenizer.eod)
        meta = {
            "corpus": cfg.corpus,
            "corpus_version": CORPORA[cfg.corpus].version(),
            "vocab_size": tokenizer.vocab_size,
            **{f"{s}_tokens": tokens[s] for s in SPLITS},
            **{f"{s}_documents": names[s] for s in SPLITS},
        }
        _write_json_atomic(d / "meta.json", meta)
        write_manifest(d, ["meta.json", "tokenizer.json",
                           *(f"{s}{ext}" for s in SPLITS for ext in (".bin", ".idx"))])
        logger.info(
            "Prepared %s in %.1f s: vocab %d, train %d documents / %d tokens, valid %d / %d -> %s",
            cfg.corpus,
            time.perf_counter() - start,
            tokenizer.vocab_size,
            len(names["train"]),
            tokens["train"],
            len(names["valid"]),
            tokens["valid"],
            d,
        )

    def _prepare_tokenizer(self, train_texts: list[str]) -> TextTokenizer:
        path = self.data_dir / "tokenizer.json"
        if path.is_file():
            return TextTokenizer.load(path)
        if self.config.tokenizer_file:
            tokenizer = TextTokenizer.load(self.config.tokenizer_file)
        else:
            tokenizer = train_bpe(train_texts, self.config.vocab_size)
        # Token files made with another tokenizer must not survive: .idx first (untrusts .bin).
        for split in SPLITS:
            for ext in (".idx", ".bin"):
                (self.data_dir / f"{split}{ext}").unlink(missing_ok=True)
        tokenizer.save(path)
        return tokenizer

    @staticmethod
    def _count_tokens(prefix: Path) -> int:
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        dataset = IndexedDataset(str(prefix))  # keep it alive: its __del__ closes the mmap
        return int(dataset.sequence_lengths.sum())

    def metadata(self) -> dict[str, Any]:
        """Contents of ``meta.json``: document names and token counts per split."""
        return json.loads((self.data_dir / "meta.json").read_text(encoding="utf-8"))

    def setup(self) -> None:
        """Load the tokenizer that ``prepare`` made."""
        if not self.is_prepared():
            raise LoongError(
                f"Text data for corpus '{self.config.corpus}' is not prepared in {self.data_dir}. "
                "Fix: call prepare() first (the trainer does so on global rank 0)."
            )
        self.tokenizer = TextTokenizer.load(self.data_dir / "tokenizer.json")

    def model_overrides(self) -> dict[str, Any]:
        """``{"vocab_size": ...}`` of the tokenizer."""
        if self.tokenizer is None:
            self.setup()
        return {"vocab_size": self.tokenizer.vocab_size}

    def build(
        self, num_train_samples: int, num_valid_samples: int, seed: int
    ) -> tuple[EpochDataset, EpochDataset]:
        """Return ``(train, valid)`` datasets of at least that many samples.

        Call on every rank: each epoch's index is built on global rank 0 first (with
        ``data.shared_cache=false`` then by the first process of every other node, in its own
        cache), the other ranks wait at a barrier and then read the cached index, so all ranks
        see the same samples. See :func:`~loong_llm.data.indexed.build_gpt_epochs` for the items and
        :class:`~loong_llm.data.indexed.EpochDataset` for why
        item ``i`` depends only on ``(config, seed, i)``.
        """
        if self.tokenizer is None:
            self.setup()
        out = []
        for split, num_samples in zip(SPLITS, (num_train_samples, num_valid_samples)):
            out.append(
                build_gpt_epochs(
                    str(self.data_dir / split),
                    split,
                    num_samples,
                    seed,
                    seq_length=self.config.seq_length,
                    tokenizer=self.tokenizer,
                    path_to_cache=str(self.data_dir / "index_cache"),
                    shared_cache=self.config.shared_cache,
                )
            )
        return out[0], out[1]

    def sample_cost(self, sample: dict) -> float:
        """Token count of a sample (``len(sample["tokens"])``)."""
        return float(len(sample["tokens"]))
