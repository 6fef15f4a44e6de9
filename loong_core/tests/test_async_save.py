"""Asynchronous checkpoints (``trainer.async_save``) at the store, in this process: a checkpoint
becomes visible only when its background write has finished, a failed write fails like a
synchronous save, and the torch engine's snapshot is the state at the save. ``loong train`` runs
with async saves (kill -9 during the write, resume, a full disk) are in
``loong_llm/tests/test_crash_safety.py`` and ``tests/test_async_checkpoints.py``.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import types

import pytest
import torch

from loong_core import testing_faults as faults
from loong_core.checkpoint import store
from loong_core.checkpoint.async_save import AsyncCheckpointer
from loong_core.engines.torch_native import checkpointing
from loong_core.errors import CheckpointSaveError

pytestmark = pytest.mark.crash_safety

RNG = {"torch": torch.get_rng_state()}
CPU = torch.device("cpu")


class _ThreadWrite:
    """A write in a thread that waits for ``release`` (so the test decides when it is done);
    ``fail`` makes it end with ENOSPC after writing part of its file."""

    def __init__(self, directory: str, fail: bool = False):
        self.release, self.error = threading.Event(), None
        self.thread = threading.Thread(target=self._write, args=(directory, fail))
        self.thread.start()

    def _write(self, directory, fail):
        self.release.wait(30)
        with open(os.path.join(directory, "shard.bin"), "wb") as handle:
            handle.write(b"x" * 1000)
        if fail:
            self.error = OSError(errno.ENOSPC, "No space left on device", f"{directory}/shard.bin")

    def done(self):
        return not self.thread.is_alive()

    def finish(self):
        self.thread.join()
        if self.error is not None:
            raise self.error

    def abort(self):
        self.release.set()
        self.thread.join()


def _start(saver, iteration, fail=False):
    writes = []
    saver.start(iteration, lambda d: writes.append(_ThreadWrite(d, fail)) or writes[-1], {"layout": {}}, RNG)
    return writes[0]


def test_an_async_checkpoint_is_committed_only_after_its_write_finished(tmp_path):
    root = tmp_path / "checkpoints"
    saver = AsyncCheckpointer(root, CPU)
    write = _start(saver, 2)
    assert saver.poll() is None and saver.poll() is None  # still writing: nothing visible
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000002.partial"]
    assert store.find_latest(root) is None
    write.release.set()
    write.thread.join()
    for _ in range(500):  # each later step checks once; this rank's shards are hashed meanwhile
        path = saver.poll()
        if path is not None:
            break
        assert store.find_latest(root) is None
        time.sleep(0.01)
    assert path == root / "iter_0000002" and saver.in_flight is None
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000002"]
    assert set(store.verify_checkpoint(path)["files"]) == {"shard.bin", "rng/rank_00000.pt"}


def test_a_second_save_while_one_is_in_flight_is_refused_until_the_first_is_waited_for(tmp_path):
    saver = AsyncCheckpointer(tmp_path, CPU)
    write = _start(saver, 2)
    with pytest.raises(RuntimeError, match="checkpoint of step 2 is still in flight"):
        _start(saver, 4)
    write.release.set()
    assert saver.wait() == tmp_path / "iter_0000002"  # blocks until written, then commits
    write = _start(saver, 4)
    write.release.set()
    assert saver.wait() == tmp_path / "iter_0000004"
    assert [p.name for p in store.list_checkpoints(tmp_path)] == ["iter_0000002", "iter_0000004"]


def test_the_time_spent_waiting_for_the_write_is_told_apart_from_the_commit(tmp_path):
    """What the log's stall breakdown reads: a wait that found the write still running reports
    the time it waited for it; one that found it done reports (almost) none."""
    saver = AsyncCheckpointer(tmp_path, CPU)
    write = _start(saver, 2)
    threading.Timer(0.3, write.release.set).start()
    saver.wait()
    assert 0.25 <= saver.last_write_wait_s < 10
    write = _start(saver, 4)
    write.release.set()
    write.thread.join()
    saver.wait()
    assert saver.last_write_wait_s < 0.25


def test_a_failed_async_write_leaves_nothing_and_keeps_the_previous_checkpoint(tmp_path):
    saver = AsyncCheckpointer(tmp_path, CPU)
    _start(saver, 2).release.set()
    kept = saver.wait()
    _start(saver, 4, fail=True).release.set()
    with pytest.raises(CheckpointSaveError, match=r"checkpoint of step 4 not saved \(rank 0: \[Errno 28\] No space "
                                                  r"left on device.*iter_0000002, is kept"):
        saver.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000002"]  # the partial folder is gone
    store.verify_checkpoint(kept)
    assert saver.in_flight is None


def test_an_aborted_async_save_is_never_visible(tmp_path):
    saver = AsyncCheckpointer(tmp_path, CPU)
    write = _start(saver, 2)
    saver.abort()
    assert write.done() and saver.in_flight is None and saver.wait() is None
    assert store.find_latest(tmp_path) is None


def _engine():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 64)).sum().backward()
    optimizer.step()
    from loong_core.devices.cpu import CPUBackend

    return types.SimpleNamespace(model=model, optimizer=optimizer, device=CPUBackend)


def test_the_torch_engine_writes_the_state_of_the_save_while_training_changes_it(tmp_path):
    engine = _engine()
    saver = AsyncCheckpointer(tmp_path, CPU)
    for iteration in (3, 4):  # the second save reuses the staging buffers of the first
        saved = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
        saver.start(iteration, lambda d: checkpointing.save_async(engine, d), {"layout": {}}, RNG)
        with torch.no_grad():  # training goes on: the weights change while the thread writes
            for p in engine.model.parameters():
                p.add_(1.0)
        path = saver.wait()
        restored = _engine()
        checkpointing.load_model_only(restored.model, str(path))
        for name, p in restored.model.named_parameters():
            assert torch.equal(p, saved[name]), (iteration, name)
        store.verify_checkpoint(path)


def test_a_dcp_async_write_into_a_full_filesystem_fails_like_a_synchronous_save(tmp_path):
    engine = types.SimpleNamespace(model=torch.nn.Linear(512, 512), optimizer=None)  # 1 MiB of weights
    engine.optimizer = torch.optim.SGD(engine.model.parameters(), lr=0.1)
    with faults.small_filesystem(tmp_path / "checkpoints", 256 * 1024) as root:
        saver = AsyncCheckpointer(root, CPU)
        with pytest.raises(CheckpointSaveError, match=r"No space left on device.*there is no earlier checkpoint"):
            # found at the commit, or at the start already when the RNG file no longer fits
            saver.start(2, lambda d: checkpointing.save_async(engine, d), {"layout": {}}, RNG)
            saver.wait()
        assert list(root.iterdir()) == []
