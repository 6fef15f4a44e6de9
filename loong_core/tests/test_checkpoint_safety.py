"""Checkpoint files never run code, and damaged checkpoints are named, not loaded.

The torch engine's files (DCP ``.metadata``, the non-tensor entries of its ``.distcp`` shards,
``loong_state.pt``) and loong's RNG files are exercised in-process here; the megatron engine's
through ``loong train`` / ``loong convert`` in ``loong_llm/tests/test_checkpoint_safety.py``.
"""

from __future__ import annotations

import logging
import shutil
import types

import pytest
import torch

from loong_core import testing_faults as faults
from loong_core.checkpoint import store
from loong_core.engines.torch_native import checkpointing
from loong_core.errors import CheckpointError

pytestmark = pytest.mark.crash_safety


class _Schedule:
    def __init__(self):
        self.num_steps = 0

    def state_dict(self):
        return {"num_steps": self.num_steps}

    def load_state_dict(self, state):
        self.num_steps = state["num_steps"]


def _engine(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return types.SimpleNamespace(model=model, optimizer=optimizer, scheduler=_Schedule())


@pytest.fixture(scope="module")
def torch_checkpoint(tmp_path_factory):
    """A torch-engine checkpoint written through the atomic store (DCP shards, state, RNG)."""
    engine = _engine(0)
    engine.scheduler.num_steps = 7

    def write(directory):
        checkpointing.save(engine, directory)
        checkpointing.save_common(directory, engine.scheduler, {"iteration": 3})

    root = tmp_path_factory.mktemp("torch_ckpt")
    path = store.save_collective(root, 3, write, record={"layout": {}},
                                 rng_state={"torch": torch.get_rng_state(), "python": (3, (1, 2), None)})
    return path, engine


@pytest.fixture
def copy(torch_checkpoint, tmp_path):
    path, _ = torch_checkpoint
    target = tmp_path / path.name
    shutil.copytree(path, target)
    return target


def test_intact_torch_checkpoint_loads_through_the_restricted_readers(torch_checkpoint):
    path, source = torch_checkpoint
    store.verify_checkpoint(path)
    engine = _engine(1)
    assert checkpointing.load(engine, str(path)) == {"iteration": 3}
    assert engine.scheduler.num_steps == 7
    for mine, theirs in zip(engine.model.parameters(), source.model.parameters()):
        assert torch.equal(mine, theirs)
    assert store.load_rng(path, 0)["python"] == (3, (1, 2), None)


@pytest.mark.parametrize("where", ["metadata", "shard_object", "loong_state", "rng"])
def test_planted_payload_never_runs(copy, tmp_path, where):
    marker = tmp_path / "payload_ran"
    if where == "metadata":
        faults.plant_in_metadata(copy, marker)
        named = ".metadata"
    elif where == "shard_object":
        faults.plant_in_shard_object(copy, marker, contains="param_groups")
        named = ".distcp"
    elif where == "loong_state":
        faults.plant_in_torch_file(copy / checkpointing.STATE_FILE, marker)
        named = checkpointing.STATE_FILE
    else:
        faults.plant_in_torch_file(copy / "rng" / "rank_00000.pt", marker)
        named = "rank_00000.pt"
    store.verify_checkpoint(copy)  # the record was rewritten too: only safe loading stops it
    with pytest.raises(CheckpointError, match="does not unpickle") as error:
        if where == "rng":
            store.load_rng(copy, 0)
        else:
            checkpointing.load(_engine(1), str(copy))
    assert named in str(error.value) and str(copy) in str(error.value)
    assert not marker.exists()


def test_weights_only_checkpoint_refuses_a_planted_metadata_for_init_from(copy, tmp_path):
    faults.plant_in_metadata(copy, tmp_path / "ran")
    with pytest.raises(CheckpointError, match=r"\.metadata: it references _operator.getitem"):
        checkpointing.load_model_only(_engine(1).model, str(copy))
    assert not (tmp_path / "ran").exists()


def test_same_size_change_truncation_and_missing_file_are_named(copy):
    shard, _ = faults.scale_tensor(copy, 1.5)
    with pytest.raises(CheckpointError, match=rf"{shard} was changed after it was written"):
        store.verify_checkpoint(copy)
    faults.truncate(copy / checkpointing.STATE_FILE)
    (copy / shard).unlink()
    with pytest.raises(CheckpointError, match=rf"{shard} is missing"):
        store.verify_checkpoint(copy)
    shutil.copy(copy / checkpointing.STATE_FILE, copy / shard)
    with pytest.raises(CheckpointError, match=rf"{shard} is (truncated|longer)"):
        store.verify_checkpoint(copy)


def test_resume_auto_falls_back_to_the_newest_intact_checkpoint(tmp_path, caplog):
    def write(directory):
        (store.Path(directory) / "shard.bin").write_bytes(b"x" * 1000)

    for step in (2, 4, 6):
        store.save_collective(tmp_path, step, write, record={}, rng_state={})
    faults.truncate(tmp_path / "iter_0000006" / "shard.bin")
    (tmp_path / "iter_0000004" / "rng" / "rank_00000.pt").unlink()
    with caplog.at_level(logging.WARNING):
        assert store.find_latest_intact(tmp_path).name == "iter_0000002"
    assert "iter_0000006/shard.bin is truncated" in caplog.text
    assert "falling back to" in caplog.text and "iter_0000002" in caplog.text
    faults.truncate(tmp_path / "iter_0000002" / "shard.bin")
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        store.find_latest_intact(tmp_path)


def test_checkpoint_without_checksums_still_loads(copy, caplog):
    import json

    record = json.loads((copy / store.COMPLETE_FILE).read_text())
    del record["files"]
    (copy / store.COMPLETE_FILE).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        store.verify_checkpoint(copy)
    assert "predates per-file checksums" in caplog.text
    assert checkpointing.load(_engine(1), str(copy)) == {"iteration": 3}


def test_rng_file_of_an_older_loong_with_numpy_state_loads(tmp_path):
    import numpy as np

    (tmp_path / "rng").mkdir()
    state = {"numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(state, tmp_path / "rng" / "rank_00000.pt")
    loaded = store.load_rng(tmp_path, 0)
    assert loaded["numpy"][0] == "MT19937" and np.array_equal(loaded["numpy"][1], state["numpy"][1])


def test_engine_reports_non_finite_weights_before_a_save():
    from loong_core.engines.base import Engine
    from loong_core.errors import TrainingError
    from loong_core.trainer.nonfinite import NonFiniteGuard

    engine = Engine(None, types.SimpleNamespace(torch_device=torch.device("cpu")), None)
    engine.model = [torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)]
    guard = NonFiniteGuard(exit_on_nan=False)
    guard.check_weights(5, engine)
    with torch.no_grad():
        engine.model[1].weight[0, 2] = float("inf")
    guard.last_good = store.Path("runs/x/checkpoints/iter_0000004")
    with pytest.raises(TrainingError, match="not finite at step 7.*checkpoint is runs/x/checkpoints/iter_0000004"):
        guard.check_weights(7, engine)
