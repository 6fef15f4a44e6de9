"""Manifests of prepared data caches: every file's size and CRC-32, checked on use.

A data module writes ``manifest.json`` last, after every file of its cache is in place
(:func:`write_manifest`), and checks it before it uses the cache (:func:`check_cache`). A damaged
cache (a truncated ``.bin``, an emptied ``tokenizer.json``, a file rewritten by another tool) is
then rebuilt with a warning when the module can rebuild it, or stops the run with one error that
names the folder and what to delete. The hashes are the checkpoints' (:mod:`loong_core.checkpoint.
integrity`, about 2 GB/s).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from loong_core.checkpoint.integrity import checkpoint_files, checksums, crc32_of
from loong_core.errors import LoongError

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


class DamagedCacheError(LoongError):
    """A prepared data cache does not match its manifest and cannot be rebuilt here."""


def write_manifest(folder: str | Path, names: list[str] | None = None) -> dict:
    """Record the size and CRC-32 of ``names`` (default: every file) of ``folder``.

    Returns:
        The manifest (``{"files": {name: {"size", "crc32"}}}``).
    """
    folder = Path(folder)
    names = names if names is not None else checkpoint_files(folder, skip=(MANIFEST,))
    manifest = {"files": checksums(folder, sorted(names))}
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, folder / MANIFEST)
    return manifest


def damage(folder: str | Path) -> str | None:
    """What is wrong with the cache in ``folder`` (None: every listed file matches)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return f"it has no {MANIFEST} (written by an older loong, or its preparation was cut short)"
    try:
        files = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"its {MANIFEST} is unreadable"
    for name, want in files.items():
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        size = file.stat().st_size
        if size != want["size"]:
            return f"{name} has {size} bytes, {want['size']} when it was written"
        if crc32_of(file) != want["crc32"]:
            return f"{name} changed since it was written (CRC-32 differs)"
    return None


def check_cache(folder: str | Path, what: str, rebuild_hint: str | None = None) -> bool:
    """Check a prepared cache before use.

    Args:
        folder: The cache folder.
        what: What it holds, for messages (``text data``, ``latent cache``).
        rebuild_hint: None when the caller rebuilds a damaged cache itself; else the command that
            recreates it, for the error.

    Returns:
        True when intact (or, when it cannot be rebuilt, written before manifests existed: used
        with a warning). False when damaged and ``rebuild_hint`` is None: the folder has been
        removed (with a warning) and the caller prepares it again.

    Raises:
        DamagedCacheError: Damaged and not rebuildable here (``rebuild_hint`` given).
    """
    folder = Path(folder)
    problem = damage(folder)
    if problem is None:
        return True
    if rebuild_hint is not None and not (folder / MANIFEST).exists():
        logger.warning("the %s in %s has no %s (written by an older loong): used unchecked; "
                       "recreate it (%s) to have it checked", what, folder, MANIFEST, rebuild_hint)
        return True
    if rebuild_hint is not None:
        raise DamagedCacheError(
            f"the {what} in {folder} is damaged: {problem}. Delete {folder} and recreate it "
            f"({rebuild_hint}).")
    logger.warning("the %s in %s is damaged: %s; rebuilding it", what, folder, problem)
    shutil.rmtree(folder, ignore_errors=True)
    return False
