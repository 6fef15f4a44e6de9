"""Listing plugins and printing help never import torch (they must stay fast)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys, io, contextlib
from loong_core.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    {call}
heavy = sorted(m for m in ("torch", "megatron", "transformers", "hydra", "numpy") if m in sys.modules)
print(",".join(heavy))
"""


@pytest.mark.parametrize("call", [
    "main(['plugins'])",
    "main(['plugins', '--json'])",
    "main(['config', 'groups'])",
    "(lambda: [main(['--help'])])() if False else main([])",
])
def test_command_does_not_import_heavy_modules(call):
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(call=call)], capture_output=True,
                         text=True, check=True, timeout=60).stdout.strip()
    assert out == "", f"{call} imported {out}"
