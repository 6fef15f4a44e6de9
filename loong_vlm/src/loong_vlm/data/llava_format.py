"""LLaVA-style records: reading ``.json`` / ``.jsonl`` files into chat messages with visual markup.

A record is ``{"image": "a.png" | ["a.png", ...], "video": ["f0.png", ...] | [[...], ...],
"conversations": [{"from": "human", "value": "<image>\\n..."}, {"from": "gpt", "value": "..."}]}``
or the same with ``messages`` (``{"role", "content"}``; content a string or a list of
``{"type": "text" | "image" | "video"}`` parts). Every ``<image>`` (``<video>``) becomes Qwen's
``<|vision_start|><|image_pad|><|vision_end|>`` (``<|video_pad|>``) markup, matched in order to
the record's images (videos); a single placeholder token per visual input, expanded to the input's
token count later (:mod:`loong_vlm.data.llava_tokens`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loong_core.errors import ConfigError
from loong_llm.data.chat import check_conversation

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
IMAGE_MARKER, VIDEO_MARKER = "<image>", "<video>"
IMAGE_MARKUP = VISION_START + IMAGE_PAD + VISION_END
VIDEO_MARKUP = VISION_START + VIDEO_PAD + VISION_END

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


@dataclass
class LlavaRecord:
    """One conversation with its visual inputs, in reading order.

    Attributes:
        messages: ``{"role", "content"}`` messages with the visual markup in place.
        images: Absolute image paths.
        videos: Absolute frame paths of each video.
        fps: Frames per second of the videos (None: unknown, one second per temporal patch).
        where: ``file:line`` (or ``file[index]``) of the record, for error messages.
    """

    messages: list[dict]
    images: list[str] = field(default_factory=list)
    videos: list[list[str]] = field(default_factory=list)
    fps: float | None = None
    where: str = ""


def _as_list(value: Any, key: str, where: str) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, (str, list)) for v in value):
        return value
    raise ConfigError(f"{where}: '{key}' must be a path or a list of paths, got {value!r}.")


def _videos(value: Any, where: str) -> list[list[str]]:
    items = _as_list(value, "video", where)
    if items and all(isinstance(v, str) for v in items):
        return [items]  # one video as a flat frame list
    if not all(isinstance(v, list) and v and all(isinstance(f, str) for f in v) for v in items):
        raise ConfigError(f"{where}: 'video' must be a list of frame paths or a list of such lists.")
    return items


def _content(content: Any, where: str) -> str:
    """A message's text with ``<image>`` / ``<video>`` markers (list-of-parts content joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                parts.append(str(part.get("text", "")))
            elif kind in ("image", "video"):
                parts.append(IMAGE_MARKER if kind == "image" else VIDEO_MARKER)
            else:
                raise ConfigError(f"{where}: bad content part {part!r}; use type text, image or video.")
        return "".join(parts)
    raise ConfigError(f"{where}: message content must be a string or a list of parts, got {content!r}.")


def _messages(record: dict, where: str) -> list[dict]:
    if "conversations" in record:
        turns = record["conversations"]
        if not isinstance(turns, list):
            raise ConfigError(f"{where}: 'conversations' must be a list of {{from, value}}.")
        messages = []
        for turn in turns:
            if not isinstance(turn, dict) or turn.get("from") not in _ROLES:
                raise ConfigError(f"{where}: bad turn {turn!r}; 'from' must be one of {sorted(_ROLES)}.")
            messages.append({"role": _ROLES[turn["from"]], "content": _content(turn.get("value"), where)})
        return messages
    if "messages" in record:
        turns = record["messages"]
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise ConfigError(f"{where}: 'messages' must be a list of {{role, content}}.")
        return [{"role": _ROLES.get(t.get("role"), t.get("role")), "content": _content(t.get("content"), where)}
                for t in turns]
    raise ConfigError(f"{where}: the record has neither 'conversations' nor 'messages'.")


def parse_record(record: Any, where: str, root: Path) -> LlavaRecord:
    """Validate one record and put the visual markup in place of its markers.

    Args:
        record: The decoded JSON object.
        where: Location for error messages.
        root: Folder that relative image / frame paths start from.

    Raises:
        ConfigError: A malformed record, or markers that do not match the images / videos.
    """
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: a record must be a JSON object, got {type(record).__name__}.")
    images = [str(root / p) for p in _as_list(record.get("image", record.get("images")), "image", where)]
    videos = [[str(root / f) for f in frames] for frames in _videos(record.get("video", record.get("videos")), where)]
    messages = _messages(record, where)
    for kind, marker, count in (("image", IMAGE_MARKER, len(images)), ("video", VIDEO_MARKER, len(videos))):
        found = sum(m["content"].count(marker) for m in messages)
        if found != count:
            raise ConfigError(f"{where}: the text has {found} {marker} marker(s) but the record lists {count} "
                              f"{kind}(s); put one {marker} where each {kind} goes.")
    for m in messages:
        if m["role"] == "assistant" and (IMAGE_MARKER in m["content"] or VIDEO_MARKER in m["content"]):
            raise ConfigError(f"{where}: an assistant reply holds an {IMAGE_MARKER}/{VIDEO_MARKER} marker; "
                              "visual inputs go in user (or system) turns.")
        m["content"] = m["content"].replace(IMAGE_MARKER, IMAGE_MARKUP).replace(VIDEO_MARKER, VIDEO_MARKUP)
    fps = record.get("fps")
    return LlavaRecord(check_conversation(messages, where), images, videos,
                       float(fps) if fps is not None else None, where)


def read_llava_records(path: str | os.PathLike, image_root: str | os.PathLike | None = None) -> list[LlavaRecord]:
    """Records of a ``.json`` file (a list of records) or a ``.jsonl`` file (one per line).

    Args:
        path: The file.
        image_root: Folder relative paths start from (default: the file's folder).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"data.path = '{path}' does not exist (a LLaVA .json or .jsonl file).")
    root = Path(image_root) if image_root is not None else path.parent
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        raw = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    raw.append((json.loads(line), f"{path}:{lineno}"))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{lineno}: not JSON ({exc.msg}).") from exc
    else:
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not JSON ({exc.msg}); a .json file holds a list of records, "
                              "a .jsonl file one record per line.") from exc
        if not isinstance(records, list):
            raise ConfigError(f"{path}: a .json file must hold a list of records.")
        raw = [(r, f"{path}[{i}]") for i, r in enumerate(records)]
    if not raw:
        raise ConfigError(f"{path}: no records.")
    return [parse_record(record, where, root) for record, where in raw]
