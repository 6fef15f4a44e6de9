"""``loong data preprocess``: text / JSON-lines / parquet -> megatron-core indexed dataset.

Outputs, next to each other (``PREFIX`` is the output prefix):

- ``PREFIX.bin`` / ``PREFIX.idx``: one document per input document, each ending in the
  tokenizer's end-of-document id (megatron-core ``IndexedDataset``);
- ``PREFIX.tokenizer/``: the tokenizer used (``tokenizer.json``, ``tokenizer_config.json``,
  chat template), so training needs only the prefix;
- ``PREFIX.meta.json``: inputs, counts, timings.

Every output is written under a temporary name and renamed; ``.idx`` is renamed after ``.bin``
and the metadata last, so a prefix whose ``.meta.json`` exists is complete.
"""

from __future__ import annotations

import itertools
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

from loong_core.errors import ConfigError
from loong_llm.data.sources import iter_documents
from loong_llm.data.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)

#: Documents sent to a worker at a time.
BATCH_DOCS = 256


def tokenizer_dir(prefix: str | os.PathLike) -> Path:
    """Folder where :func:`preprocess` saves the tokenizer of ``prefix``."""
    return Path(f"{prefix}.tokenizer")


def meta_path(prefix: str | os.PathLike) -> Path:
    """Metadata file that :func:`preprocess` writes last."""
    return Path(f"{prefix}.meta.json")


# -- workers ---------------------------------------------------------------------------------
_WORKER_TOKENIZER: Optional[TextTokenizer] = None


def _init_worker(tokenizer_json: str, eod_token: str) -> None:
    from tokenizers import Tokenizer

    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = TextTokenizer(Tokenizer.from_str(tokenizer_json), eod_token=eod_token,
                                      pad_token=None, add_missing=False)


def _encode_batch(texts: list[str]) -> tuple[list[list[int]], int]:
    from loong_llm.data.indexed import tokenize_documents

    return tokenize_documents(_WORKER_TOKENIZER, texts), sum(len(t.encode("utf-8")) for t in texts)


def _batches(docs: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(docs)
    while batch := list(itertools.islice(it, size)):
        yield batch


def _all_documents(inputs: Sequence[str], fmt, key, text_docs) -> Iterator[str]:
    for path in inputs:
        for doc in iter_documents(path, fmt, key, text_docs):
            if doc:
                yield doc


def preprocess(
    inputs: Sequence[str | os.PathLike],
    output_prefix: str | os.PathLike,
    tokenizer: TextTokenizer | str | os.PathLike | None = None,
    vocab_size: int = 32768,
    fmt: str | None = None,
    key: str = "text",
    text_docs: str = "file",
    workers: int = 1,
    progress: bool = False,
) -> dict[str, Any]:
    """Tokenize documents into a megatron-core indexed dataset at ``output_prefix``.

    Args:
        inputs: Input files (read in this order; output document order follows it).
        output_prefix: Destination path without extension.
        tokenizer: A tokenizer, a Hugging Face ``tokenizer.json`` / tokenizer directory, or None
            to train a byte-level BPE of ``vocab_size`` on the inputs first (a second pass).
        vocab_size: Vocabulary of the BPE trained when ``tokenizer`` is None.
        fmt: Input format for every file (``text``, ``jsonl``, ``parquet``); None detects it
            per file from the extension.
        key: JSON key / parquet column of the text.
        text_docs: Raw text documents: ``file``, ``paragraph`` or ``line``.
        workers: Tokenizer processes; 1 tokenizes in this process (the Rust library still uses
            several threads).
        progress: Show a tqdm progress bar over input bytes.

    Returns:
        The metadata written to ``PREFIX.meta.json`` (documents, tokens, seconds, ...).
    """
    from loong_llm.data.hf_tokenizer import load_tokenizer, save_tokenizer_dir
    from loong_llm.data.indexed import write_indexed_dataset
    from loong_llm.data.tokenizer import train_bpe

    if workers < 1:
        raise ConfigError(f"--workers {workers} must be at least 1.")
    inputs = [str(p) for p in inputs]
    if not inputs:
        raise ConfigError("No input files given.")
    for path in inputs:
        if not os.path.isfile(path):
            raise ConfigError(f"Input file {path!r} does not exist.")
    prefix = Path(output_prefix)
    start = time.perf_counter()
    meta_path(prefix).unlink(missing_ok=True)  # untrust an older result while rewriting
    if tokenizer is None:
        logger.info("Training a byte-level BPE of %d tokens on %d file(s)", vocab_size, len(inputs))
        tokenizer = train_bpe(_all_documents(inputs, fmt, key, text_docs), vocab_size)
        source = f"bpe-{vocab_size}"
    elif isinstance(tokenizer, TextTokenizer):
        source = "given"
    else:
        source = str(tokenizer)
        tokenizer = load_tokenizer(tokenizer)
    save_tokenizer_dir(tokenizer, tokenizer_dir(prefix))
    total_bytes = sum(os.path.getsize(p) for p in inputs)
    counts = {"documents": 0, "bytes": 0}

    def encoded() -> Iterator[list[int]]:
        from tqdm import tqdm

        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="preprocess",
                   disable=not progress, dynamic_ncols=True)
        batches = _batches(_all_documents(inputs, fmt, key, text_docs), BATCH_DOCS)
        pool = None
        try:
            if workers == 1:
                _init_worker(tokenizer.tokenizer.to_str(), tokenizer.tokenizer.id_to_token(tokenizer.eod))
                results: Iterable = map(_encode_batch, batches)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process
                ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
                pool = ctx.Pool(workers, initializer=_init_worker, initargs=(
                    tokenizer.tokenizer.to_str(), tokenizer.tokenizer.id_to_token(tokenizer.eod)))
                results = pool.imap(_encode_batch, batches)  # ordered: output is deterministic
            for ids_list, nbytes in results:
                counts["documents"] += len(ids_list)
                counts["bytes"] += nbytes
                bar.update(nbytes)
                yield from ids_list
        finally:
            if pool is not None:
                pool.terminate()
            bar.close()

    num_tokens = write_indexed_dataset(prefix, encoded(), tokenizer.vocab_size, tokenizer.eod)
    seconds = time.perf_counter() - start
    meta = {
        "inputs": inputs,
        "format": fmt or "auto",
        "key": key,
        "tokenizer": source,
        "vocab_size": tokenizer.vocab_size,
        "documents": counts["documents"],
        "tokens": num_tokens,
        "input_bytes": counts["bytes"],
        "seconds": round(seconds, 3),
        "workers": workers,
    }
    tmp = meta_path(prefix).with_name(f".{meta_path(prefix).name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, meta_path(prefix))
    logger.info("Preprocessed %d documents, %d tokens in %.1f s (%.2f MB/s) -> %s",
                counts["documents"], num_tokens, seconds, counts["bytes"] / 1e6 / max(seconds, 1e-9), prefix)
    return meta
