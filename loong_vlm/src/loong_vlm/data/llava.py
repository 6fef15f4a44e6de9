"""The ``llava`` dataset: LLaVA-style conversations with images and videos at dynamic resolution.

``prepare`` (rank 0) reads the records, trains or loads the tokenizer, tokenizes every
conversation (one placeholder per visual input) and reads each image's size from its file header,
writing ``<split>.jsonl`` and the tokenizer into the data cache (``meta.json`` last). ``setup``
turns sizes into patch grids and token counts; ``build`` groups records into samples (packed or
one each), reshuffled every epoch; ``collate`` decodes the pixels of a micro batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from loong_core.config.compose import cache_root
from loong_core.errors import ConfigError, LoongError
from loong_vlm.data.config import LlavaConfig
from loong_vlm.data.llava_batch import EncodedRecord, SampleLayout, collate_llava
from loong_vlm.data.llava_format import (
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    VISION_TOKENS,
    LlavaRecord,
    read_llava_records,
)

logger = logging.getLogger(__name__)

PIPELINE_VERSION = 1
SPLITS = ("train", "valid")


def _sha256_file(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _tokenizer_key(path: str) -> str:
    """Digest of a tokenizer file or of a tokenizer directory's small text files."""
    folder = Path(path)
    files = sorted(f for f in folder.iterdir() if f.suffix in (".json", ".jinja", ".txt")) if folder.is_dir() \
        else [folder]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()


def _image_size(path: str, where: str) -> tuple[int, int]:
    """``(height, width)`` from the file header (the pixels are not decoded)."""
    from PIL import Image

    if not os.path.isfile(path):
        raise ConfigError(f"{where}: image file '{path}' does not exist (relative paths start from "
                          "data.image_root, by default the folder of the data file).")
    with Image.open(path) as image:
        return image.height, image.width


def _record_row(tokenizer, record: LlavaRecord) -> dict:
    """What ``prepare`` stores of a record: unexpanded tokens, mask and visual sizes."""
    from loong_vlm.data.llava_tokens import encode_messages

    ids, mask = encode_messages(tokenizer, record.messages)
    videos = []
    for frames in record.videos:
        sizes = {_image_size(f, record.where) for f in frames}
        if len(sizes) != 1:
            raise ConfigError(f"{record.where}: the frames of a video differ in size: {sorted(sizes)}.")
        videos.append([len(frames), *sizes.pop()])
    return {"ids": ids.tolist(), "mask": mask.tolist(), "images": record.images,
            "image_sizes": [_image_size(f, record.where) for f in record.images],
            "videos": record.videos, "video_sizes": videos, "fps": record.fps, "where": record.where}


class LlavaSplit:
    """Map-style samples of one split: records grouped into samples, reshuffled every epoch.

    Args:
        layout: How records become samples.
        records: The split's records.
        num_samples: At least this many samples (whole epochs).
        seed: Base seed of the per-epoch shuffles.
        split: ``train`` or ``valid`` (part of the shuffle seed).
    """

    def __init__(self, layout: SampleLayout, records: list[EncodedRecord], num_samples: int, seed: int, split: str):
        from loong_llm.data.packing import pack

        self.layout, self.records = layout, records
        sizes = [layout.positions(r) for r in records]
        self.samples: list[list[int]] = []
        epoch = 0
        while epoch == 0 or len(self.samples) < num_samples:
            rng = np.random.default_rng([seed % 2**63, SPLITS.index(split), epoch])
            order = rng.permutation(len(records))
            if layout.pack:
                bins = pack([sizes[j] for j in order], layout.seq_length, layout.pack_algorithm, rng)
                self.samples.extend([int(order[j]) for j in b] for b in bins)
            else:
                self.samples.extend([int(j)] for j in order)
            epoch += 1

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> dict:
        return self.layout.sample([self.records[j] for j in self.samples[int(idx)]])


class LlavaDataModule:
    """LLaVA-style multimodal SFT data (implements ``loong_core``'s ``DataModule``).

    Args:
        config: The validated dataset config.
    """

    config_class = LlavaConfig

    def __init__(self, config: LlavaConfig):
        self.config = config
        self.processor = config.vision_processor()
        self.tokenizer = None
        self.layout: SampleLayout | None = None
        self.records: dict[str, list[EncodedRecord]] = {}
        self._data_dir: Path | None = None
        self._timestamp_cache: dict[str, list[int]] = {}

    # -- files -------------------------------------------------------------------------------
    def source_path(self) -> Path:
        """The training records (the demo set's file when ``data.path`` is null)."""
        if self.config.path is not None:
            return Path(self.config.path)
        from loong_vlm.data.llava_digits import demo_path

        return demo_path(cache_root(self.config.cache_dir))

    @property
    def data_dir(self) -> Path:
        """Cache folder of this config's prepared records."""
        if self._data_dir is None:
            cfg, path = self.config, self.source_path()
            if not path.is_file():
                raise ConfigError(f"data.path = '{path}' does not exist (a LLaVA .json or .jsonl file).")
            if cfg.tokenizer is not None and not os.path.exists(cfg.tokenizer):
                raise ConfigError(f"data.tokenizer = '{cfg.tokenizer}' does not exist.")
            key = {"pipeline": PIPELINE_VERSION, "train": _sha256_file(path),
                   "valid": _sha256_file(cfg.valid_path) if cfg.valid_path else cfg.valid_fraction,
                   "image_root": str(Path(cfg.image_root).resolve()) if cfg.image_root else None,
                   "tokenizer": _tokenizer_key(cfg.tokenizer) if cfg.tokenizer else cfg.vocab_size}
            digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
            self._data_dir = cache_root(cfg.cache_dir) / "llava" / f"{path.stem}-{digest}"
        return self._data_dir

    def _split_records(self) -> dict[str, list[LlavaRecord]]:
        cfg = self.config
        train = read_llava_records(self.source_path(), cfg.image_root)
        if cfg.valid_path is not None:
            return {"train": train, "valid": read_llava_records(cfg.valid_path, cfg.image_root)}
        from loong_llm.data.corpus import split_documents

        if len(train) < 2:
            raise ConfigError(f"{self.source_path()} has one record; give data.valid_path or more records.")
        names = [f"{i:09d}" for i in range(len(train))]
        return {split: [train[int(n)] for n in chosen]
                for split, chosen in zip(SPLITS, split_documents(names, cfg.valid_fraction))}

    def prepare(self) -> None:
        """Tokenize the records and read image sizes into the cache (idempotent, atomic)."""
        from loong_llm.data.hf_tokenizer import load_tokenizer, save_tokenizer_dir
        from loong_vlm.data.llava_tokens import train_llava_tokenizer

        if self.config.path is None:
            from loong_vlm.data.llava_digits import write_demo_set

            write_demo_set(cache_root(self.config.cache_dir))
        d = self.data_dir
        if (d / "meta.json").is_file():
            return
        records = self._split_records()
        if self.config.tokenizer:
            tokenizer = load_tokenizer(self.config.tokenizer)
        else:
            texts = [m["content"] for r in records["train"] for m in r.messages] + ["user\n", "assistant\n"]
            for token in VISION_TOKENS:
                texts = [t.replace(token, " ") for t in texts]
            tokenizer = train_llava_tokenizer(texts, self.config.vocab_size)
        d.mkdir(parents=True, exist_ok=True)
        save_tokenizer_dir(tokenizer, d / "tokenizer")
        meta: dict[str, Any] = {"vocab_size": tokenizer.vocab_size}
        for split in SPLITS:
            tmp = d / f".{split}.jsonl.tmp-{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                for record in records[split]:
                    f.write(json.dumps(_record_row(tokenizer, record)) + "\n")
            os.replace(tmp, d / f"{split}.jsonl")
            meta[f"{split}_records"] = len(records[split])
        tmp = d / f".meta.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, d / "meta.json")
        logger.info("Prepared LLaVA records -> %s (%s)", d, meta)

    # -- setup -------------------------------------------------------------------------------
    def setup(self) -> None:
        """Load the tokenizer and the records; check every record fits ``seq_length``."""
        from loong_llm.data.hf_tokenizer import load_tokenizer
        from loong_vlm.data.llava_tokens import vision_token_ids

        cfg, d = self.config, self.data_dir
        if not (d / "meta.json").is_file():
            raise LoongError(f"LLaVA data is not prepared in {d}; call prepare() first.")
        self.tokenizer = load_tokenizer(d / "tokenizer")
        ids = vision_token_ids(self.tokenizer, cfg.tokenizer or str(d / "tokenizer"))
        pad = self.tokenizer.pad if self.tokenizer.pad >= 0 else self.tokenizer.eod
        self.layout = SampleLayout(cfg.seq_length, pad, cfg.pack, ids[IMAGE_PAD], ids[VIDEO_PAD], self.processor,
                                   cfg.mrope, cfg.tokens_per_second, cfg.video_layout, ids[VISION_START],
                                   ids[VISION_END], cfg.pack_algorithm)
        for split in SPLITS:
            with open(d / f"{split}.jsonl", encoding="utf-8") as f:
                rows = [json.loads(line) for line in f]
            self.records[split] = self._fitting([self._encoded(row) for row in rows], split)

    def _encoded(self, row: dict) -> EncodedRecord:
        p = self.processor
        seconds = p.temporal_patch_size / row["fps"] if row.get("fps") else 1.0
        return EncodedRecord(np.asarray(row["ids"], dtype=np.int64), np.asarray(row["mask"], dtype=np.int64),
                             row["images"], [p.image_grid(h, w) for h, w in row["image_sizes"]], row["videos"],
                             [p.video_grid(n, h, w) for n, h, w in row["video_sizes"]],
                             [seconds] * len(row["videos"]), row["where"], self._frame_prefixes(row))

    def _frame_prefixes(self, row: dict) -> list[list[list[int]]]:
        """Token ids of the timestamp before each temporal patch / clip of each video (``qwen3_vl`` and
        ``kimi_k25`` layouts)."""
        from loong_vlm.data.video_layout import timestamp_prefixes

        if self.config.video_layout not in ("qwen3_vl", "kimi_k25"):
            return []
        return timestamp_prefixes(row["video_sizes"], row.get("fps"), self.processor, self._timestamp_cache,
                                  self.tokenizer.encode, self.config.video_layout)

    def _fitting(self, records: list[EncodedRecord], split: str) -> list[EncodedRecord]:
        cfg, kept = self.config, []
        for record in records:
            need = self.layout.positions(record)
            if need <= cfg.seq_length:
                kept.append(record)
            elif not cfg.skip_too_long:
                visual = sum(self.processor.tokens(g) for g in (*record.image_grids, *record.video_grids))
                raise ConfigError(
                    f"{record.where}: the record needs {need} positions ({visual} of them image/video "
                    f"placeholders) but data.seq_length is {cfg.seq_length}; set data.seq_length={need} or more, "
                    "lower data.max_pixels / data.video_max_pixels, or drop such records with "
                    "data.skip_too_long=true.")
        if len(kept) < len(records):
            logger.warning("%s: dropped %d of %d records longer than data.seq_length=%d", split,
                           len(records) - len(kept), len(records), cfg.seq_length)
        if not kept:
            raise ConfigError(f"no {split} record fits data.seq_length={cfg.seq_length}.")
        return kept

    # -- DataModule --------------------------------------------------------------------------
    def model_overrides(self) -> dict[str, Any]:
        """Vocabulary, placeholder ids, the vision start / end ids (image start, image end, video
        start, video end: models that route them as vision tokens, e.g. ERNIE-4.5-VL's
        ``vision_start_token_ids``) and the vision geometry the model must agree with."""
        if self.layout is None:
            self.setup()
        p, start, end = self.processor, self.layout.vision_start_id, self.layout.vision_end_id
        return {"vocab_size": self.tokenizer.vocab_size, "image_token_id": self.layout.image_token_id,
                "video_token_id": self.layout.video_token_id, "vision_start_token_ids": [start, end, start, end],
                "num_channels": 3, "patch_size": p.patch_size,
                "temporal_patch_size": p.temporal_patch_size, "spatial_merge_size": p.merge_size,
                "tokens_per_second": self.config.tokens_per_second, "mrope_positions": self.config.mrope,
                "video_layout": self.config.video_layout, "image_processing": self.config.image_processing,
                **({"tile_size": self.config.tile_size} if self.config.image_processing == "tiles" else {})}

    def build(self, num_train_samples: int, num_valid_samples: int, seed: int) -> tuple[LlavaSplit, LlavaSplit]:
        """``(train, valid)`` samples, at least that many of each."""
        if self.layout is None:
            self.setup()
        return (LlavaSplit(self.layout, self.records["train"], num_train_samples, seed, "train"),
                LlavaSplit(self.layout, self.records["valid"], num_valid_samples, seed, "valid"))

    def sample_cost(self, sample: dict) -> float:
        """Positions the sample's records take (text and visual placeholders; no pixel decoded)."""
        return float(sample["num_positions"])

    def collate(self, samples: list[dict]) -> dict:
        """Stack the micro batch and decode its images and videos (``docs/vlm_inputs.md``)."""
        return collate_llava(samples, self.processor)
