"""Checkpoints become visible only when complete; resume never picks a partial one."""

from __future__ import annotations

import pytest

from loong_core.checkpoint import store
from loong_core.errors import CheckpointError


def _save(root, iteration, fail=False):
    def write(directory):
        (store.Path(directory) / "shard.bin").write_bytes(b"x" * 10)
        if fail:
            raise RuntimeError("disk full")

    return store.save_collective(root, iteration, write, record={"layout": {}}, rng_state={"seed": 1})


def test_complete_checkpoint_is_found(tmp_path):
    path = _save(tmp_path, 5)
    assert path.name == "iter_0000005"
    assert store.find_latest(tmp_path) == path
    assert store.read_record(path)["iteration"] == 5
    assert store.load_rng(path, 0) == {"seed": 1}


def _killed_save(root, iteration):
    """What a save killed halfway leaves: a partial folder with some of its files."""
    partial = root / (store.checkpoint_name(iteration) + ".partial")
    partial.mkdir()
    (partial / "shard.bin").write_bytes(b"x" * 5)
    return partial


def test_interrupted_save_is_never_picked(tmp_path):
    _save(tmp_path, 5)
    _killed_save(tmp_path, 10)
    assert store.find_latest(tmp_path).name == "iter_0000005"


def test_a_save_that_raises_removes_its_partial_folder(tmp_path):
    _save(tmp_path, 5)
    with pytest.raises(RuntimeError, match="disk full"):
        _save(tmp_path, 10, fail=True)
    assert not (tmp_path / "iter_0000010.partial").exists()
    assert store.find_latest(tmp_path).name == "iter_0000005"


def test_folder_without_completion_record_is_ignored(tmp_path):
    _save(tmp_path, 5)
    (tmp_path / "iter_0000009").mkdir()
    assert store.find_latest(tmp_path).name == "iter_0000005"


def test_retry_replaces_a_stale_partial(tmp_path):
    _killed_save(tmp_path, 10)
    path = _save(tmp_path, 10)
    assert not (tmp_path / "iter_0000010.partial").exists()
    assert store.find_latest(tmp_path) == path


def test_corrupt_record_is_a_clear_error(tmp_path):
    path = _save(tmp_path, 3)
    (path / store.COMPLETE_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="not a complete loong checkpoint"):
        store.read_record(path)
    assert store.find_latest(tmp_path) == path  # visible, but loading it fails loudly


def test_prune_keeps_newest(tmp_path):
    for i in (1, 2, 3):
        _save(tmp_path, i)
    store.prune(tmp_path, keep=2)
    assert [p.name for p in store.list_checkpoints(tmp_path)] == ["iter_0000002", "iter_0000003"]
