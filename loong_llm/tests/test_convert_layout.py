"""The fast path of ``loong convert``: ``hf-to-loong`` records each file's checksum as it writes
it and stores the model's tensor layout; ``loong-to-hf`` of such a checkpoint needs no
megatron-core, gives the bytes the model-based reader gives, and publishes nothing from a
checkpoint whose checksums fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from loong_core import testing_faults as faults
from loong_llm.hf.layout import LAYOUT_FILE
from loong_llm.hf.testing import write_hf_model


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loong_core.cli.main", "convert", *args],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    import torch

    root = tmp_path_factory.mktemp("layout")
    src = write_hf_model("qwen3", root / "src", seed=5, dtype=torch.bfloat16)
    proc = _cli("hf-to-loong", "--family", "qwen3", str(src), str(root / "ckpt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return src, root / "ckpt"


def _tensors(directory):
    """Every tensor of an HF directory as its bytes."""
    import torch
    from safetensors import safe_open

    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out.update({k: f.get_tensor(k).reshape(-1).view(torch.uint8) for k in f.keys()})
    return out


def test_loong_to_hf_reads_the_stored_layout_without_megatron_core_like_through_a_model(converted, tmp_path):
    from loong_core.checkpoint import store

    src, checkpoint = converted
    store.verify_checkpoint(checkpoint)  # the checksums taken while writing are the files'
    code = ("import sys; from loong_llm.hf.convert import loong_to_hf; "
            f"loong_to_hf({str(checkpoint)!r}, {str(tmp_path / 'fast')!r}); "
            "print('megatron imported:', 'megatron.core' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "megatron imported: False" in proc.stdout
    slow = tmp_path / "ckpt"
    shutil.copytree(checkpoint, slow)
    (slow / LAYOUT_FILE).unlink()  # as a checkpoint of loong train: read through a meta model
    faults.rerecord_checksums(slow)
    proc = _cli("loong-to-hf", str(slow), str(tmp_path / "slow"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    fast, through_model, source = (_tensors(d) for d in (tmp_path / "fast", tmp_path / "slow", src))
    assert sorted(fast) == sorted(through_model) == sorted(source)
    assert all(fast[k].equal(through_model[k]) and fast[k].equal(source[k]) for k in fast)


def test_loong_to_hf_of_a_changed_shard_names_it_and_writes_nothing(converted, tmp_path):
    _, checkpoint = converted
    damaged = tmp_path / "ckpt"
    shutil.copytree(checkpoint, damaged)
    shard, _ = faults.scale_tensor(damaged, 1.5, contains="decoder.layers")  # still loadable
    out = tmp_path / "hf"
    proc = _cli("loong-to-hf", str(damaged), str(out))
    assert proc.returncode == 2
    assert f"error: {damaged / shard} was changed after it was written" in proc.stderr
    assert not out.exists() and not (tmp_path / "hf.partial").exists()


def test_loong_to_hf_never_runs_code_planted_in_a_tensor_chunk(converted, tmp_path):
    _, checkpoint = converted
    planted = tmp_path / "ckpt"
    shutil.copytree(checkpoint, planted)
    marker = tmp_path / "payload_ran"
    faults.plant_in_shard_object(planted, marker, "decoder.layers", tensor=True)  # checksums redone
    proc = _cli("loong-to-hf", str(planted), str(tmp_path / "hf"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "__0_0.distcp" in proc.stderr and "does not unpickle" in proc.stderr
    assert not marker.exists() and not (tmp_path / "hf").exists()
