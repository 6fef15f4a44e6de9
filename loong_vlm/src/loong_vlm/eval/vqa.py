"""Greedy answers and exact-match accuracy of a trained VLM (``loong eval vqa``)."""

from __future__ import annotations

import logging
import re
import time

import torch

from loong_core.errors import ConfigError
from loong_core.step_progress import StepProgress
from loong_vlm.eval.loading import LoadedVLM
from loong_vlm.eval.tasks import VQAItem
from loong_vlm.provider import VISUAL_KEYS

logger = logging.getLogger(__name__)

SPLITS = ("valid", "train")


@torch.no_grad()
def next_token_logits(vlm: LoadedVLM, batch: dict) -> torch.Tensor:
    """Logits ``[b, vocab]`` (padding columns removed) of the token after each row's last position."""
    visual = {key: batch[key] for key in VISUAL_KEYS if batch.get(key) is not None}
    logits = vlm.model(batch["tokens"], batch["position_ids"], None, images=batch.get("images"), **visual)
    return logits[:, -1, : vlm.provider.config.foundation.vocab_size].float()


def greedy_answers(vlm: LoadedVLM, task, items: list[VQAItem], max_new_tokens: int) -> list[list[int]]:
    """Token ids each item's model generates after its prompt, up to an end-of-turn token (excluded)
    or ``max_new_tokens``. The items share one ``task.batch_key``; the whole sequences are
    recomputed each step (no KV cache). A finished row keeps growing until all are finished: rows
    are causal and independent, so that changes no answer."""
    rows = [list(item.prompt) for item in items]
    generated: list[list[int]] = [[] for _ in items]
    finished = [False] * len(items)
    for _ in range(max_new_tokens):
        tokens = next_token_logits(vlm, task.inputs(items, rows)).argmax(dim=-1).tolist()
        for i, token in enumerate(tokens):
            rows[i].append(token)
            finished[i] = finished[i] or token in task.end_ids
            if not finished[i]:
                generated[i].append(token)
        if all(finished):
            break
    return generated


def prompt_text(tokenizer, ids: list[int]) -> str:
    """The prompt as rendered text with its special tokens, each run of one repeated special token
    (an image's placeholders) shown once."""
    text = tokenizer.tokenizer.decode(list(ids), skip_special_tokens=False)
    return re.sub(r"(<\|[a-z_]+\|>)\1+", r"\1", text)


def _batches(task, items: list[VQAItem], batch_size: int) -> list[list[VQAItem]]:
    """Consecutive runs of items with one ``batch_key``, at most ``batch_size`` each."""
    batches: list[list[VQAItem]] = []
    for item in items:
        last = batches[-1] if batches else None
        if last and len(last) < batch_size and task.batch_key(last[0]) == task.batch_key(item):
            last.append(item)
        else:
            batches.append([item])
    return batches


def evaluate(vlm: LoadedVLM, split: str = "valid", data_file: str | None = None, image_root: str | None = None,
             max_new_tokens: int | None = None, limit: int | None = None, show: int = 5,
             batch_size: int = 32) -> dict:
    """Answer every evaluation item greedily and score exact matches (after strip).

    Args:
        vlm: The loaded model and its data module.
        split: The run's split to evaluate when ``data_file`` is None (``valid`` or ``train``).
        data_file: A LLaVA ``.json`` / ``.jsonl`` file to evaluate instead (``llava`` runs).
        image_root: Folder the file's relative image paths start from (default: the file's folder).
        max_new_tokens: Decoding limit (None: the task's default).
        limit: Evaluate the first ``limit`` items only.
        show: Example rows (prompt, expected, got) to return.
        batch_size: Items answered together (those the task can batch: equal-length digit prompts).

    Returns:
        ``{"checkpoint", "dataset", "source", "count", "correct", "accuracy", "max_new_tokens",
        "seconds", "examples"}``; each example is ``{"where", "prompt", "expected", "got", "correct",
        "got_ids"}`` (``got_ids``: the generated token ids, end-of-turn excluded).
    """
    from loong_vlm.eval.tasks import LlavaTask, task_for

    if split not in SPLITS:
        raise ConfigError(f"--split {split!r} is not one of {', '.join(SPLITS)}.")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit {limit} must be at least 1.")
    task = task_for(vlm.data)
    if isinstance(task, LlavaTask):
        items = task.items(split, limit, data_file, image_root)
    elif data_file is not None:
        raise ConfigError(f"--data is for llava runs; this run trained on '{vlm.config.data.name}', which "
                          "evaluates its own digits: drop --data (and use --split valid|train).")
    else:
        items = task.items(split, limit)
    if not items:
        raise ConfigError(f"no records to evaluate in {data_file or split}.")
    max_new = max_new_tokens if max_new_tokens is not None else task.default_max_new_tokens
    if max_new < 1:
        raise ConfigError(f"--max-new-tokens {max_new} must be at least 1.")
    if batch_size < 1:
        raise ConfigError(f"--batch-size {batch_size} must be at least 1.")
    start = time.perf_counter()
    batches = _batches(task, items, batch_size)
    answers = []
    with StepProgress(len(batches), f"answering {len(items)} questions") as progress:
        for done, batch in enumerate(batches, 1):
            answers += greedy_answers(vlm, task, batch, max_new)
            progress.update(done)
    correct, examples = 0, []
    for i, (item, answer) in enumerate(zip(items, answers)):
        got = task.decode(answer).strip()
        correct += got == item.expected
        if i < show:
            examples.append({"where": item.where, "prompt": prompt_text(task.tokenizer, item.prompt),
                             "expected": item.expected, "got": got, "correct": got == item.expected,
                             "got_ids": answer})
    return {"checkpoint": str(vlm.checkpoint), "dataset": vlm.config.data.name,
            "source": str(data_file) if data_file else split, "count": len(items), "correct": correct,
            "accuracy": correct / len(items), "max_new_tokens": max_new,
            "seconds": round(time.perf_counter() - start, 2), "examples": examples}
