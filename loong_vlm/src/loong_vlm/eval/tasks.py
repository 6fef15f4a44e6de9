"""Evaluation items of the VLM datasets: prompt tokens, expected answer and the model inputs of a
growing token sequence, built with each dataset's own encoding code (so the placeholders, their
expansion and the position ids are those of training).

A task has ``items(split, limit)``, ``inputs(items, rows)`` (the batch of token rows: each item's
prompt + generated ids), ``batch_key(item)`` (items with equal keys may share a batch),
``decode(ids)``, ``end_ids`` (end-of-turn tokens that stop decoding) and ``default_max_new_tokens``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loong_core.errors import ConfigError

END_OF_TURN = "<|im_end|>"


@dataclass
class VQAItem:
    """One question to answer.

    Attributes:
        where: Where it comes from (``digit 17``, ``file.jsonl:3``).
        prompt: Token ids of the conversation up to the last assistant reply (its header included).
        expected: The reference reply (stripped).
        visual: What the task needs to rebuild the visual inputs.
    """

    where: str
    prompt: list[int]
    expected: str
    visual: Any


def last_reply_span(mask: np.ndarray) -> tuple[int, int] | None:
    """``(start, end)`` of the last run of assistant tokens in a 0/1 mask, None when there is none."""
    at = np.flatnonzero(np.asarray(mask) > 0)
    if len(at) == 0:
        return None
    end = int(at[-1]) + 1
    gaps = np.flatnonzero(np.diff(at) > 1)
    start = int(at[gaps[-1] + 1]) if len(gaps) else int(at[0])
    return start, end


def _end_ids(tokenizer) -> set[int]:
    ids = {tokenizer.tokenizer.token_to_id(END_OF_TURN), getattr(tokenizer, "eod", None)}
    return {int(i) for i in ids if i is not None and i >= 0}


class DigitsTask:
    """The ``digits_vqa`` held-out (or training) digits: ``<|image|>\\nWhich digit is this?`` -> digit.

    A run trained on the digit only (``data.train_end_of_turn=false``, the default) never learned to
    end its turn, so its answer is its first token (``default_max_new_tokens`` 1); with
    ``train_end_of_turn=true`` decoding runs until ``<|im_end|>``.
    """

    def __init__(self, data):
        self.data = data
        self.tokenizer = data.tokenizer
        self.end_ids = _end_ids(self.tokenizer)
        self.default_max_new_tokens = 8 if data.config.train_end_of_turn else 1

    def items(self, split: str, limit: int | None) -> list[VQAItem]:
        from loong_vlm.data.conversation import IMAGE_TOKEN, encode_conversation

        d, cfg = self.data, self.data.config
        digits = d.valid_indices if split == "valid" else d.train_indices
        items = []
        for digit in digits[:limit]:
            label = str(int(d.labels[digit]))
            messages = [{"role": "user", "content": f"{IMAGE_TOKEN}\n{cfg.question}"},
                        {"role": "assistant", "content": label}]
            ids, mask = encode_conversation(self.tokenizer, messages, cfg.image_tokens)
            start, _ = last_reply_span(mask)
            items.append(VQAItem(f"digit {int(digit)}", ids[:start].tolist(), label, d.images[digit]))
        return items

    def batch_key(self, item: VQAItem) -> int:
        """Prompts of one length batch together (every row grows by one token per step)."""
        return len(item.prompt)

    def inputs(self, items: list[VQAItem], rows: list[list[int]]) -> dict:
        """Tokens ``[b, s]``, positions and one image per row ``[b, 1, c, h, w]``."""
        tokens = torch.tensor(rows, dtype=torch.long)
        return {"tokens": tokens, "position_ids": torch.arange(tokens.shape[1]).expand_as(tokens),
                "images": torch.stack([item.visual.reshape(1, *item.visual.shape[-3:]) for item in items])}

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


class LlavaTask:
    """LLaVA records (the run's own split or a ``--data`` file) at dynamic resolution with MRoPE."""

    def __init__(self, data):
        self.data = data
        self.tokenizer = data.tokenizer
        self.layout = data.layout
        self.end_ids = _end_ids(self.tokenizer)
        self.default_max_new_tokens = 32

    def records(self, split: str, data_file: str | None, image_root: str | None) -> list:
        """Encoded records of the run's ``split`` or of ``data_file``."""
        if data_file is None:
            return self.data.records[split]
        from loong_vlm.data.llava import _record_row
        from loong_vlm.data.llava_format import read_llava_records

        if not Path(data_file).is_file():
            raise ConfigError(f"--data {data_file} does not exist (a LLaVA .json or .jsonl file).")
        if image_root is not None and not Path(image_root).is_dir():
            raise ConfigError(f"--image-root {image_root} is not a directory (relative image paths start there).")
        return [self.data._encoded(_record_row(self.tokenizer, r)) for r in read_llava_records(data_file, image_root)]

    def items(self, split: str, limit: int | None, data_file: str | None = None,
              image_root: str | None = None) -> list[VQAItem]:
        from loong_vlm.data.llava_batch import collate_llava

        items = []
        for record in self.records(split, data_file, image_root)[:limit]:
            span = last_reply_span(record.mask)
            if span is None:
                raise ConfigError(f"{record.where}: the conversation has no assistant reply to compare with; "
                                  "every evaluation record must end with the expected answer.")
            start, end = span
            expected = self.tokenizer.decode(record.ids[start:end].tolist()).strip()
            sample = {"tokens": torch.zeros(1, dtype=torch.long), "image_files": record.images,
                      "image_grid_thw": torch.tensor(record.image_grids, dtype=torch.long).reshape(-1, 3),
                      "video_files": record.videos,
                      "video_grid_thw": torch.tensor(record.video_grids, dtype=torch.long).reshape(-1, 3)}
            visual = collate_llava([sample], self.layout.processor)
            visual.pop("tokens")
            items.append(VQAItem(record.where, record.ids[:start].tolist(), expected, (record, visual)))
        return items

    def batch_key(self, item: VQAItem) -> str:
        """One record per batch (records expand to different lengths)."""
        return item.where

    def inputs(self, items: list[VQAItem], rows: list[list[int]]) -> dict:
        """Expanded tokens, their (MRoPE) position ids and the decoded pixels of one record."""
        if len(items) != 1:
            raise ValueError(f"LLaVA records are decoded one at a time, got {len(items)}.")
        (item,), (ids,) = items, rows
        record, visual = item.visual
        grown = dataclasses.replace(record, ids=np.asarray(ids, dtype=np.int64),
                                    mask=np.zeros(len(ids), dtype=np.int64))
        expanded, _ = self.layout.expanded(grown)
        if self.layout.mrope:
            positions = self.layout.record_position_ids(grown, expanded)
        else:
            positions = torch.arange(len(expanded))
        return {"tokens": torch.from_numpy(expanded).unsqueeze(0), "position_ids": positions.unsqueeze(0),
                **visual}

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def task_for(data):
    """The evaluation task of a set-up data module.

    Raises:
        ConfigError: The dataset has no VQA evaluation.
    """
    from loong_vlm.data.digits import DigitsVQADataModule
    from loong_vlm.data.llava import LlavaDataModule

    if isinstance(data, DigitsVQADataModule):
        return DigitsTask(data)
    if isinstance(data, LlavaDataModule):
        return LlavaTask(data)
    raise ConfigError(f"the run trained on data '{data.config.name}', which `loong eval vqa` cannot read; "
                      "it evaluates digits_vqa and llava runs.")
