"""megatron-core indexed datasets (``<prefix>.bin`` + ``<prefix>.idx``): write, then serve.

Writing: one document = one sequence ending in the end-of-document id. Both files are written under
temporary names in the destination folder and moved into place with ``os.replace``, ``.bin``
first and ``.idx`` last, so a prefix whose ``.idx`` exists next to its ``.bin`` is complete:
:func:`indexed_dataset_exists` is the only test readers should trust.

Serving: :func:`build_gpt_epochs` wraps a prefix in megatron-core ``GPTDataset`` epochs.
"""

from __future__ import annotations

import logging
import math
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from loong_core.errors import ConfigError, LoongError

if TYPE_CHECKING:
    from loong_llm.data.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)

# Split points where the GPT-2 pre-tokenizer regex always starts a new piece: after a
# non-space character, before whitespace. Encoding the parts separately gives the same ids.
_SAFE_SPLIT = re.compile(r"(?<=\S)(?=\s)")


def indexed_dataset_exists(prefix: str | os.PathLike) -> bool:
    """Whether a complete indexed dataset is at ``prefix`` (both ``.bin`` and ``.idx``)."""
    return os.path.isfile(f"{prefix}.bin") and os.path.isfile(f"{prefix}.idx")


def write_indexed_dataset(
    prefix: str | os.PathLike,
    docs_token_ids: Iterable[Sequence[int]],
    vocab_size: int,
    eod: Optional[int] = None,
) -> int:
    """Write documents of token ids as an indexed dataset, atomically.

    Args:
        prefix: Destination path without extension; its folder is created.
        docs_token_ids: Token ids per document.
        vocab_size: Vocabulary size; picks the on-disk dtype (uint16 below 65500, else int32).
        eod: End-of-document id appended to every document; None when the documents already
            end with it.

    Returns:
        Number of tokens written, end-of-document tokens included.
    """
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    dtype = DType.optimal_dtype(vocab_size)
    tmp = prefix.with_name(f".{prefix.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp_bin, tmp_idx = Path(f"{tmp}.bin"), Path(f"{tmp}.idx")
    num_tokens = 0
    try:
        builder = IndexedDatasetBuilder(str(tmp_bin), dtype=dtype)
        for ids in docs_token_ids:
            doc = np.asarray(ids, dtype=dtype) if eod is None else np.append(ids, eod).astype(dtype)
            builder.add_document(doc, lengths=[doc.size])
            num_tokens += doc.size
        builder.finalize(str(tmp_idx))
        os.replace(tmp_bin, f"{prefix}.bin")
        os.replace(tmp_idx, f"{prefix}.idx")
    finally:
        tmp_bin.unlink(missing_ok=True)
        tmp_idx.unlink(missing_ok=True)
    logger.info("Wrote %s.{bin,idx}: %d tokens (%s)", prefix, num_tokens, np.dtype(dtype).name)
    return num_tokens


def tokenize_documents(
    tokenizer: TextTokenizer, texts: Sequence[str], chunk_chars: int = 8192
) -> list[list[int]]:
    """Token ids of each text, identical to ``tokenizer.encode(text)``, encoded in parallel.

    With a GPT-2 style byte-level tokenizer (``tokenizer.splits_at_whitespace``) each text is
    cut at whitespace boundaries into chunks of about ``chunk_chars`` characters, so that
    ``encode_batch`` spreads even a few long documents over all cores; other tokenizers encode
    whole texts.

    Args:
        tokenizer: A :class:`~loong_llm.data.tokenizer.TextTokenizer`.
        texts: Documents.
        chunk_chars: Approximate chunk size in characters.

    Returns:
        Token ids per text.
    """
    if not getattr(tokenizer, "splits_at_whitespace", False):
        return tokenizer.encode_batch(texts)
    chunks: list[str] = []
    owners: list[int] = []
    for i, text in enumerate(texts):
        buf: list[str] = []
        size = 0
        for part in _SAFE_SPLIT.split(text):
            buf.append(part)
            size += len(part)
            if size >= chunk_chars:
                chunks.append("".join(buf))
                owners.append(i)
                buf, size = [], 0
        if buf:
            chunks.append("".join(buf))
            owners.append(i)
    out: list[list[int]] = [[] for _ in texts]
    for owner, ids in zip(owners, tokenizer.encode_batch(chunks)):
        out[owner].extend(ids)
    return out


class EpochDataset:
    """Epochs of megatron-core ``GPTDataset`` one after another (a map-style dataset).

    Item ``i`` is sample ``i % epoch_length`` of epoch ``i // epoch_length``. Each epoch is a
    whole pass over the split with its own document and sample shuffle, seeded from
    ``(seed, split, epoch)``, so item ``i`` does not depend on how many samples were asked for:
    a run resumed with more iterations sees the same first samples.

    Attributes:
        epochs: One ``GPTDataset`` per epoch.
        epoch_length: Samples per epoch (``(tokens - 1) // seq_length``).
    """

    def __init__(self, epochs: list, epoch_length: int):
        self.epochs = epochs
        self.epoch_length = epoch_length

    def __len__(self) -> int:
        return len(self.epochs) * self.epoch_length

    def __getitem__(self, idx: int) -> dict:
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(f"index {idx} out of range for {len(self)} samples")
        epoch, j = divmod(int(idx), self.epoch_length)
        return self.epochs[epoch][j]


@contextmanager
def _as_index_cache_writer() -> Iterator[None]:
    """Let megatron-core build and save the index cache in this process (a node's first process).

    ``GPTDataset`` writes its cache only where ``torch.distributed.get_rank() == 0`` and loads it
    everywhere else, which assumes one cache every node sees. On a node-local disk the first
    process of each node must write its own copy, so for the duration of the build that process
    reads as rank 0 (nothing else runs collectives meanwhile: the build is local). The index is a
    pure function of the dataset, the seed and the sample count, so every node's copy is the same.
    """
    import torch.distributed as dist

    get_rank = dist.get_rank
    dist.get_rank = lambda group=None: 0
    try:
        yield
    finally:
        dist.get_rank = get_rank


def _drop_broken_index_cache(path_to_cache: Path) -> None:
    """Delete cached GPTDataset indices that an interrupted run left half written."""
    for npy in sorted(path_to_cache.glob("*.npy")):
        try:
            np.load(npy, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError):
            stem = npy.name.rsplit("-", 2)[0]  # <hash>-<class>-<split>
            logger.warning("Removing broken dataset index cache %s*", path_to_cache / stem)
            for path in path_to_cache.glob(f"{stem}-*"):
                path.unlink(missing_ok=True)


def build_gpt_epochs(
    prefix: str,
    split: str,
    num_samples: int,
    seed: int,
    seq_length: int,
    tokenizer: TextTokenizer,
    path_to_cache: str,
    documents: Optional[np.ndarray] = None,
    shared_cache: bool = True,
) -> EpochDataset:
    """Build enough GPTDataset epochs over the indexed dataset at ``prefix``.

    Items are ``tokens``/``labels``/``position_ids`` (int64 ``[seq_length]``, labels are tokens
    shifted by one) and ``loss_mask`` (float32). Distributed: call on every rank; each epoch is
    built on global rank 0 first, then (after a barrier) loaded from ``path_to_cache`` by the
    others, as megatron-core's ``BlendedMegatronDatasetBuilder`` does (node-local caches: see
    ``shared_cache``). Without a process group
    the index is built (or loaded from ``path_to_cache``) in this process.

    Args:
        prefix: Indexed dataset path without extension.
        split: ``train`` or ``valid`` (megatron-core ``Split`` name; part of the seed).
        num_samples: Samples needed; ``ceil(num_samples / epoch_length)`` epochs are built.
        seed: Base seed; epoch ``e`` is shuffled with a seed drawn from ``(seed, split, e)``.
        seq_length: Tokens per sample.
        tokenizer: Supplies ``eod``, ``pad``, ``vocab_size`` and ``unique_identifiers``.
        path_to_cache: Folder of megatron-core's cached sample/shuffle indices. Its cache keys
            do not cover ``documents``: use one folder per document selection.
        documents: Indices of the documents to use (int32); None uses all of them.
        shared_cache: ``path_to_cache`` is on a filesystem all nodes see. When false (a
            node-local disk), the first process of every other node builds its node's copy after
            global rank 0 built its own, and the node's other processes load it.

    Returns:
        At least ``num_samples`` samples (whole epochs).
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split

    if not indexed_dataset_exists(prefix):
        raise LoongError(f"No indexed dataset at {prefix}.bin/.idx: call prepare() first.")
    index_split = Split[split]
    indexed = IndexedDataset(prefix, multimodal=False, mmap=True)
    if documents is None:
        documents = np.arange(indexed.sequence_lengths.shape[0], dtype=np.int32)
    num_tokens = int(indexed.sequence_lengths[documents].sum())
    epoch_length = (num_tokens - 1) // seq_length  # one extra token for the shifted labels
    if epoch_length < 1:
        raise ConfigError(
            f"data.seq_length = {seq_length} is longer than the whole {split} split "
            f"({num_tokens} tokens); lower it or hold out more documents (data.valid_fraction)."
        )
    num_epochs = max(1, math.ceil(num_samples / epoch_length))
    blend: list = [None, None, None]
    blend[index_split.value] = ([prefix], None)

    def build_epoch(epoch: int):
        """One GPTDataset epoch, built in this process or loaded from ``path_to_cache``."""
        epoch_seed = np.random.SeedSequence([seed % 2**63, index_split.value, epoch])
        config = GPTDatasetConfig(
            random_seed=int(epoch_seed.generate_state(1)[0]),
            sequence_length=seq_length,
            blend_per_split=blend,
            path_to_cache=path_to_cache,
            tokenizer=tokenizer,
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            create_attention_mask=False,
        )
        dataset = BlendedMegatronDatasetBuilder.build_generic_dataset(
            GPTDataset, lambda: True, False, indexed, prefix, documents, None, index_split, config
        )
        if len(dataset) != epoch_length:
            raise RuntimeError(f"{split} epoch {epoch} has {len(dataset)} samples, not {epoch_length}")
        return dataset

    def build_all() -> list:
        return [build_epoch(epoch) for epoch in range(num_epochs)]

    def build_and_cache() -> list:
        Path(path_to_cache).mkdir(parents=True, exist_ok=True)
        _drop_broken_index_cache(Path(path_to_cache))
        return build_all()

    import torch.distributed as dist

    if not dist.is_initialized():
        epochs = build_and_cache()
    else:
        # Global rank 0 builds (and caches) first; the others load its cache after a barrier.
        # Node-local caches: then each other node's first process builds its own copy (a cache
        # hit where the disk is shared after all), and its node loads that after a second barrier.
        epochs = build_and_cache() if dist.get_rank() == 0 else None
        dist.barrier()
        if not shared_cache:
            if epochs is None and int(os.environ.get("LOCAL_RANK", "0")) == 0:
                with _as_index_cache_writer():
                    epochs = build_and_cache()
            dist.barrier()
        if epochs is None:
            epochs = build_all()
    logger.info(
        "%s: %d epoch(s) x %d samples of %d tokens (asked for %d samples)",
        split,
        num_epochs,
        epoch_length,
        seq_length,
        num_samples,
    )
    return EpochDataset(epochs, epoch_length)

