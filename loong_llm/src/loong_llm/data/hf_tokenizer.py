"""Hugging Face tokenizers: a ``tokenizer.json`` or a tokenizer directory, with its chat template.

A tokenizer directory is what ``transformers`` writes with ``save_pretrained``: ``tokenizer.json``
(the fast tokenizer, read with ``tokenizers``), ``tokenizer_config.json`` (``eos_token``,
``pad_token``, ``bos_token``, and in older versions ``chat_template``) and, in newer versions,
``chat_template.jinja``. A directory without ``tokenizer.json`` (a slow, sentencepiece-only
tokenizer) is converted with ``transformers.AutoTokenizer`` when transformers is installed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from loong_core.errors import ConfigError, MissingDependencyError
from loong_llm.data.tokenizer import EOD_TOKEN, PAD_TOKEN, TextTokenizer

logger = logging.getLogger(__name__)

#: Names of special tokens in ``tokenizer_config.json`` that chat templates read.
TEMPLATE_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _token_str(value: Any) -> str | None:
    """``"<s>"`` or ``{"content": "<s>", ...}`` (AddedToken) -> ``"<s>"``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_chat_template(folder: Path, config: dict) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if template is None and (folder / "chat_template.json").is_file():
        template = json.loads((folder / "chat_template.json").read_text("utf-8")).get("chat_template")
    return template if isinstance(template, str) else None


def _fast_tokenizer_from_transformers(folder: Path):
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise MissingDependencyError(
            "transformers", "transformers", f"Converting the tokenizer in {folder} (no tokenizer.json)"
        ) from exc
    hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(
            f"The tokenizer in {folder} has no fast (tokenizers) version; save one with "
            "AutoTokenizer.from_pretrained(...).save_pretrained(DIR) from a fast tokenizer."
        )
    return backend


def load_tokenizer(path: str | os.PathLike) -> TextTokenizer:
    """Load a Hugging Face tokenizer with its special tokens and chat template.

    Args:
        path: A ``tokenizer.json`` file (its folder's ``tokenizer_config.json`` is read when
            present) or a tokenizer directory.

    Returns:
        A :class:`TextTokenizer` whose ``eod`` is the config's ``eos_token`` and ``pad`` its
        ``pad_token`` (-1 when it has none), with ``chat_template`` set. A bare
        ``tokenizer.json`` without config gets ``<|endoftext|>`` / ``<|pad|>`` added when missing.

    Raises:
        ConfigError: ``path`` does not exist or holds no tokenizer.
    """
    from tokenizers import Tokenizer

    path = Path(path).expanduser()
    if path.is_dir():
        folder, file = path, path / "tokenizer.json"
    elif path.is_file():
        folder, file = path.parent, path
    else:
        raise ConfigError(
            f"Tokenizer path {str(path)!r} does not exist; give a tokenizer.json file or a "
            "directory written by transformers' save_pretrained."
        )
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text("utf-8")) if config_file.is_file() else {}
    if file.is_file():
        backend = Tokenizer.from_file(str(file))
    elif path.is_dir() and config_file.is_file():
        backend = _fast_tokenizer_from_transformers(folder)
    else:
        raise ConfigError(f"No tokenizer.json in {str(path)!r}.")
    tokens = {k: _token_str(config.get(k)) for k in TEMPLATE_TOKEN_KEYS}
    tokens = {k: v for k, v in tokens.items() if v is not None}
    eos = tokens.get("eos_token")
    chat_template = _read_chat_template(folder, config)
    if eos is None:
        tokenizer = TextTokenizer(backend, chat_template=chat_template, template_tokens=tokens)
    else:
        pad = tokens.get("pad_token") or (PAD_TOKEN if backend.token_to_id(PAD_TOKEN) is not None else None)
        tokenizer = TextTokenizer(backend, eod_token=eos, pad_token=pad, add_missing=False,
                                  chat_template=chat_template, template_tokens=tokens)
    logger.debug("Loaded tokenizer %s from %s (chat template: %s)", tokenizer, path,
                 chat_template is not None)
    return tokenizer


def save_tokenizer_dir(tokenizer: TextTokenizer, folder: str | os.PathLike) -> Path:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``chat_template.jinja``) atomically.

    The directory is assembled under a temporary name and renamed into place, so
    :func:`load_tokenizer` never sees a half-written one.

    Args:
        tokenizer: The tokenizer to save.
        folder: Destination directory (replaced when it exists).

    Returns:
        The directory.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        tokenizer.tokenizer.save(str(tmp / "tokenizer.json"))
        config: dict[str, Any] = dict(tokenizer.template_tokens)
        config["eos_token"] = tokenizer.tokenizer.id_to_token(tokenizer.eod)
        if tokenizer.pad >= 0:
            config["pad_token"] = tokenizer.tokenizer.id_to_token(tokenizer.pad)
        if tokenizer.chat_template is not None:
            (tmp / "chat_template.jinja").write_text(tokenizer.chat_template, encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


__all__ = ["EOD_TOKEN", "load_tokenizer", "save_tokenizer_dir"]
