"""Documents of raw text, JSON-lines and parquet files, for ``loong data preprocess``.

Formats by extension: ``.txt``/``.md``/``.text`` (raw text), ``.jsonl``/``.json``/``.ndjson``
(one JSON object per line, the text under a key), ``.parquet`` (a string column). Files may be
gzip-compressed (``.gz``) except parquet.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

from loong_core.errors import ConfigError, MissingDependencyError

FORMATS = ("text", "jsonl", "parquet")
TEXT_DOCS = ("file", "paragraph", "line")
_EXTENSIONS = {".txt": "text", ".text": "text", ".md": "text", ".jsonl": "jsonl", ".json": "jsonl",
               ".ndjson": "jsonl", ".parquet": "parquet"}


def detect_format(path: str | os.PathLike) -> str:
    """``text``, ``jsonl`` or ``parquet`` from the file name (a ``.gz`` suffix is looked through)."""
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    fmt = _EXTENSIONS.get(Path(name).suffix)
    if fmt is None:
        raise ConfigError(
            f"Cannot tell the format of {str(path)!r} from its extension; pass --format "
            f"{'|'.join(FORMATS)} (known extensions: {', '.join(sorted(_EXTENSIONS))})."
        )
    return fmt


def _open_text(path: Path) -> io.TextIOBase:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _text_docs(path: Path, text_docs: str) -> Iterator[str]:
    with _open_text(path) as f:
        if text_docs == "file":
            yield f.read()
        elif text_docs == "line":
            for line in f:
                yield line.rstrip("\n")
        else:  # paragraph: blank-line separated
            buf: list[str] = []
            for line in f:
                if line.strip():
                    buf.append(line)
                elif buf:
                    yield "".join(buf).rstrip("\n")
                    buf = []
            if buf:
                yield "".join(buf).rstrip("\n")


def _jsonl_docs(path: Path, key: str) -> Iterator[str]:
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{lineno}: not JSON ({exc.msg}).") from exc
            value = record.get(key) if isinstance(record, dict) else None
            if not isinstance(value, str):
                keys = sorted(record) if isinstance(record, dict) else []
                raise ConfigError(
                    f"{path}:{lineno}: no string under key {key!r} (keys: {keys}); pass --json-key."
                )
            yield value


def _parquet_docs(path: Path, key: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingDependencyError("pyarrow", "pyarrow", "Reading parquet files") from exc
    pf = pq.ParquetFile(path)
    if key not in pf.schema_arrow.names:
        raise ConfigError(
            f"{path}: no column {key!r} (columns: {pf.schema_arrow.names}); pass --json-key."
        )
    for batch in pf.iter_batches(columns=[key], batch_size=1024):
        for value in batch.column(0).to_pylist():
            if value is not None:
                yield value


def iter_documents(
    path: str | os.PathLike, fmt: str | None = None, key: str = "text", text_docs: str = "file"
) -> Iterator[str]:
    """Documents of one file, in file order.

    Args:
        path: Input file.
        fmt: ``text``, ``jsonl`` or ``parquet``; None detects it from the extension.
        key: JSON key or parquet column holding the text.
        text_docs: For raw text: one document per ``file``, per blank-line separated
            ``paragraph`` or per ``line``.

    Yields:
        Document texts (null parquet values are skipped).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Input file {str(path)!r} does not exist.")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise ConfigError(f"Unknown format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    if text_docs not in TEXT_DOCS:
        raise ConfigError(f"Unknown text document mode {text_docs!r}; choose one of {', '.join(TEXT_DOCS)}.")
    if fmt == "text":
        yield from _text_docs(path, text_docs)
    elif fmt == "jsonl":
        yield from _jsonl_docs(path, key)
    else:
        yield from _parquet_docs(path, key)
