"""A tiny real LLaVA-format dataset made on the fly from scikit-learn's handwritten digits.

Each digit (8x8, 17 grey levels) is upscaled to its own random size and aspect ratio and saved
as a PNG. Records mix single images (``Which digit is this?``), pairs (``What are these
digits?``, answered ``3 and 7``) and 4-frame videos of a digit drifting sideways (``Which digit
moves in this video?``); some use ``conversations`` (from/value), the rest ``messages``
(role/content), so both layouts are exercised. Everything is deterministic from the seed.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np

from loong_core.errors import MissingDependencyError

DEMO_VERSION = 1
DEMO_RECORDS = 240


def demo_path(root: Path) -> Path:
    """The demo set's JSONL file under the data cache ``root``."""
    return Path(root) / "llava_digits" / f"v{DEMO_VERSION}-{DEMO_RECORDS}" / "data.jsonl"


def _digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise MissingDependencyError("sklearn", "scikit-learn", "The LLaVA digits demo set") from exc
    digits = load_digits()
    return digits.images, digits.target


def _save(image: np.ndarray, height: int, width: int, path: Path) -> None:
    """An 8x8 digit in [0, 16] resized to ``height x width`` and saved as a grey PNG."""
    from PIL import Image

    grey = Image.fromarray((image * (255.0 / 16.0)).astype(np.uint8), mode="L")
    grey.resize((width, height), resample=Image.Resampling.BILINEAR).save(path)


def _drift(image: np.ndarray, shift: int) -> np.ndarray:
    """The digit moved ``shift`` pixels right on its 8x8 canvas (blank where it left)."""
    out = np.zeros_like(image)
    out[:, shift:] = image[:, : image.shape[1] - shift]
    return out


def _record(index: int, rng: np.random.Generator, images: np.ndarray, labels: np.ndarray, folder: Path) -> dict:
    kind = ("pair", "video", "image", "image", "image")[index % 5]
    picks = rng.integers(0, len(labels), size=2)
    height, width = (int(v) for v in rng.integers(12, 48, size=2))
    name = f"{index:05d}"
    if kind == "image":
        _save(images[picks[0]], height, width, folder / f"{name}.png")
        media, question = {"image": f"images/{name}.png"}, "<image>\nWhich digit is this?"
        answer = str(labels[picks[0]])
    elif kind == "pair":
        files = []
        for k, pick in enumerate(picks):
            _save(images[pick], height + 4 * k, width, folder / f"{name}_{k}.png")
            files.append(f"images/{name}_{k}.png")
        media = {"image": files}
        question = "What are these digits?\n<image> <image>"
        answer = f"{labels[picks[0]]} and {labels[picks[1]]}"
    else:
        files = []
        for frame in range(4):
            _save(_drift(images[picks[0]], frame // 2), height, width, folder / f"{name}_f{frame}.png")
            files.append(f"images/{name}_f{frame}.png")
        media, question, answer = {"video": files}, "<video>\nWhich digit moves in this video?", str(labels[picks[0]])
    if index % 2:
        turns = {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]}
    else:
        turns = {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
    return {"id": name, **media, **turns}


def write_demo_set(root: Path, seed: int = 0) -> Path:
    """Write the demo set under ``root`` once (atomically) and return its JSONL file."""
    target = demo_path(root)
    if target.is_file():
        return target
    images, labels = _digits()
    folder = target.parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    (tmp / "images").mkdir(parents=True)
    try:
        rng = np.random.default_rng(seed)
        records = [_record(i, rng, images, labels, tmp / "images") for i in range(DEMO_RECORDS)]
        (tmp / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        try:
            os.replace(tmp, folder)
        except OSError:
            if not target.is_file():  # another process finished first otherwise
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
