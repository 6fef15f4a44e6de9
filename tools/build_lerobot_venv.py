#!/usr/bin/env python3
"""Build the LeRobot reference venv that loong's ``lerobot``-marked tests compare against.

LeRobot 0.4.4 pins ``torch<2.11`` and ``transformers<5``, so it can never share an environment
with loong (torch 2.13, transformers 5). This script puts it in a venv of its own:

    python tools/build_lerobot_venv.py            # build (or confirm) the venv, print its path
    python tools/build_lerobot_venv.py --path     # only print where it is / would be
    python tools/build_lerobot_venv.py --force    # rebuild from scratch

Location: ``$LOONG_LEROBOT_VENV``, else ``$LOONG_CACHE/lerobot-0.4.4``, else
``~/.cache/loong/lerobot-0.4.4``. The build is idempotent: its last step writes a marker file
(``loong-reference.json``) holding the requested pins and the versions that were installed, and a
rerun whose pins match that marker does nothing. A build that stops halfway leaves no marker, so
the next run starts over.

PyPI's only Linux x86_64 torch wheels are CUDA builds: torch itself plus the ``nvidia-*`` wheels
it requires, about 4.5 GB installed. There is no CPU-only torch on PyPI (the CPU wheels live on
the PyTorch index, which is not PyPI), so that is what the venv holds; it runs on CPU all the same.

This file uses only the standard library and is also imported by the test suite
(``loong_embodied/tests/lerobot_ref``) to locate the venv: keep it that way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

LEROBOT_VERSION = "0.4.4"
VENV_ENV = "LOONG_LEROBOT_VENV"
MARKER = "loong-reference.json"

#: What the venv gets. LeRobot's ``smolvla`` and ``xvla`` extras install as they are; its ``groot``
#: extra also requires ``flash-attn``, which has no wheel on PyPI and whose source build needs the
#: CUDA compiler, so the groot extra's other requirements are listed one by one instead.
REQUIREMENTS = [
    f"lerobot[smolvla,xvla]=={LEROBOT_VERSION}",
    "torch>=2.2.1,<2.11",
    "torchvision<0.26",
    "transformers>=4.57.1,<5",
    # lerobot[groot] without flash-attn:
    "peft>=0.13,<1",
    "dm-tree>=0.1.8,<1",
    "timm>=1.0,<1.1",
    "safetensors>=0.4.3,<1",
    "Pillow>=10,<13",
]

#: Packages whose installed versions the marker records.
RECORDED = ["lerobot", "torch", "transformers", "safetensors", "numpy"]


def venv_dir() -> Path:
    """Where the reference venv is (or would be built).

    Returns:
        ``$LOONG_LEROBOT_VENV`` if set, else ``$LOONG_CACHE/lerobot-<version>``, else
        ``~/.cache/loong/lerobot-<version>``.
    """
    if os.environ.get(VENV_ENV):
        return Path(os.environ[VENV_ENV]).expanduser()
    cache = Path(os.environ.get("LOONG_CACHE") or Path.home() / ".cache" / "loong")
    return cache / f"lerobot-{LEROBOT_VERSION}"


def venv_python(root: Path) -> Path:
    """The interpreter of the venv at ``root``."""
    return root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def read_marker(root: Path) -> dict | None:
    """The marker of a finished build at ``root``, or None when there is none (or it is unreadable)."""
    try:
        marker = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and venv_python(root).is_file() else None


def is_built(root: Path) -> bool:
    """Whether ``root`` holds a finished build with the pins this script asks for."""
    marker = read_marker(root)
    return marker is not None and marker.get("requirements") == REQUIREMENTS


def _installed_versions(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys; "
            "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))")
    out = subprocess.run([str(python), "-c", code, *RECORDED], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def build(root: Path, python: str = sys.executable, force: bool = False) -> dict:
    """Create the venv at ``root`` and install :data:`REQUIREMENTS` into it.

    Args:
        root: the venv folder.
        python: the interpreter the venv is made from (3.10 or newer, as LeRobot requires).
        force: rebuild even when the marker says the venv is already there.

    Returns:
        The marker written (or found), with the installed versions, the build time in seconds
        and the venv size in bytes.
    """
    if is_built(root) and not force:
        return read_marker(root) or {}
    if root.exists():
        shutil.rmtree(root)
    start = time.monotonic()
    subprocess.run([python, "-m", "venv", str(root)], check=True)
    pip = [str(venv_python(root)), "-m", "pip", "install", "--no-input"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, *REQUIREMENTS], check=True)
    # The import is the check that the build works; only then is the marker written.
    subprocess.run([str(venv_python(root)), "-c", "import lerobot.policies, torch, transformers"], check=True)
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())
    marker = {"requirements": REQUIREMENTS, "versions": _installed_versions(venv_python(root)),
              "build_seconds": round(time.monotonic() - start, 1), "size_bytes": size}
    (root / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return marker


def main(argv: list[str] | None = None) -> int:
    """Command line: build the venv (or print its path) and print where it is."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", action="store_true", help="print the venv path and whether it is built")
    parser.add_argument("--force", action="store_true", help="rebuild even if the marker says it is built")
    parser.add_argument("--python", default=sys.executable, help="interpreter to make the venv from")
    args = parser.parse_args(argv)
    root = venv_dir()
    if args.path:
        print(f"{root} ({'built' if is_built(root) else 'absent'})")
        return 0
    was_built = is_built(root) and not args.force
    marker = build(root, python=args.python, force=args.force)
    state = "already built" if was_built else "built"
    print(f"{root}: {state}; versions {marker.get('versions')}; "
          f"{marker.get('size_bytes', 0) / 2**30:.2f} GiB; build took {marker.get('build_seconds')} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
