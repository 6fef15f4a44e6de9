"""Under TP2 (2 gloo ranks) the kernels equal megatron-core's vocab_parallel_cross_entropy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loong_core.testing import free_port

WORKER = Path(__file__).with_name("tp_worker.py")


@pytest.fixture(scope="module")
def tp2_differences(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp2") / "diffs.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), str(WORKER), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.multirank
def test_vocab_parallel_kernels_equal_megatron_within_1e_5(tp2_differences):
    assert len(tp2_differences) == 2 * (2 + 3 * 2) + 1
    for name, diff in tp2_differences.items():
        assert diff < 1e-5, (name, diff)
