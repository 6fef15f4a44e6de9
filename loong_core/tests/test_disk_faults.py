"""Storage faults at the checkpoint store, in this process: a save the disk cannot take fails as a
whole, leaves nothing behind and keeps the checkpoints before it; a read-only run directory is a
ConfigError; the straggler rule. ``tests/test_world_faults.py`` runs the same through ``loong train``.
"""

from __future__ import annotations

import errno
import json

import pytest
import torch

from loong_core import testing_faults as faults
from loong_core.checkpoint import space, store
from loong_core.errors import CheckpointSaveError, ConfigError
from loong_core.trainer.straggler import stragglers

pytestmark = pytest.mark.crash_safety

RNG = {"torch": torch.get_rng_state()}


def _writer(size: int, fail_after: int | None = None):
    """``write_shards`` that writes ``size`` bytes, or raises ENOSPC after ``fail_after`` of them
    (as a full disk does: the bytes that fit stay on disk)."""
    def write(directory: str):
        with open(f"{directory}/shard.bin", "wb") as handle:
            handle.write(b"x" * (size if fail_after is None else fail_after))
        if fail_after is not None:
            raise OSError(errno.ENOSPC, "No space left on device", f"{directory}/shard.bin")
    return write


def _save(root, iteration, write):
    return store.save_collective(root, iteration, write, record={"layout": {}}, rng_state=RNG)


def test_a_save_that_runs_out_of_space_leaves_nothing_and_keeps_the_previous_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    kept = _save(root, 2, _writer(4096))
    with pytest.raises(CheckpointSaveError) as caught:
        _save(root, 4, _writer(4096, fail_after=1000))
    message = str(caught.value)
    assert "checkpoint of step 4 not saved (rank 0: [Errno 28] No space left on device" in message
    assert "iter_0000004.partial/shard.bin" in message  # the file that did not fit
    assert "the newest complete checkpoint, iter_0000002, is kept" in message
    assert f"trainer.resume={tmp_path}" in message  # how to continue elsewhere
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000002"]
    assert store.find_latest_intact(root) == kept
    store.verify_checkpoint(kept)  # every file of it as its record says


def test_a_failed_save_of_the_same_iteration_keeps_the_complete_one(tmp_path):
    root = tmp_path / "checkpoints"
    kept = _save(root, 2, _writer(4096))
    with pytest.raises(CheckpointSaveError):
        _save(root, 2, _writer(4096, fail_after=10))
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000002"]
    store.verify_checkpoint(kept)


def test_a_save_is_refused_before_writing_when_less_is_free_than_the_last_checkpoint_took(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _save(root, 2, _writer(200_000))
    size = space.checkpoint_size(root / "iter_0000002")
    assert size > 200_000
    monkeypatch.setattr(space, "free_bytes", lambda path: size - 1)
    called = []
    human = space.human_bytes(size)  # 197.2 KiB: the shard and the RNG file
    with pytest.raises(CheckpointSaveError, match=rf"\[Errno 28\] No space left on device: {human} free in "
                                                  rf".*, the newest checkpoint \(iter_0000002\) took {human}; "
                                                  "checked before writing"):
        _save(root, 4, lambda directory: called.append(directory))
    assert called == []  # nothing was written
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000002"]


def test_a_failure_that_is_not_the_storage_is_raised_as_it_is_and_cleaned_up(tmp_path):
    root = tmp_path / "checkpoints"

    def broken(directory):
        raise ValueError("a bug in the engine")

    with pytest.raises(ValueError, match="a bug in the engine"):
        _save(root, 2, broken)
    assert list(root.iterdir()) == []


def test_an_oserror_that_crossed_processes_is_found_in_its_text():
    from torch.distributed.checkpoint.api import CheckpointException

    # megatron-core's writer workers: the OSError becomes text in a RuntimeError, gathered per rank
    worker = RuntimeError("Worker failure: [Errno 28] No space left on device: '/ckpt/__1_0.distcp'")
    error = space.storage_error(CheckpointException("write", {1: (worker, None)}))
    assert (error.errno, error.filename) == (errno.ENOSPC, "/ckpt/__1_0.distcp")
    assert space.storage_error(RuntimeError("unexpected pos 704 vs 598")) is None
    assert space.reported_elsewhere(CheckpointException("write", {}))  # only says another rank failed


def test_a_write_error_without_errno_on_a_full_disk_is_the_full_disk(tmp_path, monkeypatch):
    # torch's zip writer reports a short write as "unexpected pos", dropping the OSError
    zip_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(space, "free_bytes", lambda path: 4096)
    error = space.full_disk_error(zip_error, tmp_path)
    assert error.errno == errno.ENOSPC and "4.0 KiB free" in str(error) and "unexpected pos 704" in str(error)
    monkeypatch.setattr(space, "free_bytes", lambda path: 10 * 2 ** 30)
    assert space.full_disk_error(zip_error, tmp_path) is None  # room left: another kind of failure


def test_dcp_on_a_real_full_filesystem(tmp_path):
    """torch.distributed.checkpoint (the torch engine's format) writing into a 256 KiB tmpfs."""
    import torch.distributed.checkpoint as dcp

    state = {"weight": torch.randn(256, 512)}  # 512 KiB
    with faults.small_filesystem(tmp_path / "checkpoints", 256 * 1024) as root:
        with pytest.raises(CheckpointSaveError, match=r"No space left on device.*there is no earlier checkpoint"):
            _save(root, 2, lambda directory: dcp.save(state, checkpoint_id=directory))
        assert list(root.iterdir()) == []
        assert space.free_bytes(root) == 256 * 1024  # every byte given back


def test_a_read_only_run_directory_is_a_config_error(tmp_path):
    from loong_core.config.rules import check_writable_dir

    run_dir = tmp_path / "run"
    with faults.read_only_folder(run_dir):
        with pytest.raises(ConfigError, match=rf"'trainer.run_dir' = '{run_dir}': {run_dir} is not writable "
                                              r"\((read-only file system|permission denied)\), so the run cannot be "
                                              "written there. Make it writable .* or choose another trainer.run_dir"):
            check_writable_dir(run_dir, "trainer.run_dir", "run")
        with pytest.raises(ConfigError, match=f"{run_dir} is not writable"):  # a new folder inside it
            check_writable_dir(run_dir / "new", "trainer.run_dir", "run")


def test_a_read_only_checkpoints_folder_of_a_run_is_a_config_error(tmp_path):
    from loong_core.config.rules import check_writable_dir

    run_dir = tmp_path / "run"
    (run_dir / "metrics.jsonl").parent.mkdir()
    with faults.read_only_folder(run_dir / "checkpoints"):
        with pytest.raises(ConfigError, match=f"{run_dir / 'checkpoints'} is not writable"):
            check_writable_dir(run_dir, "trainer.run_dir", "run", subfolders=("checkpoints",))


def test_a_straggler_is_the_rank_above_factor_times_the_median_of_the_others():
    assert stragglers([0.10, 0.11, 0.40, 0.09], [0, 0, 0, 0], 1.5) == [(2, 0.40, 0.10)]
    assert stragglers([0.10, 0.11, 0.14, 0.09], [0, 0, 0, 0], 1.5) == []  # 1.4x: within the factor
    assert stragglers([0.1, 0.3], [0, 0], 1.5) == [(1, 0.3, 0.1)]  # two ranks: each against the other


def test_pipeline_stages_are_compared_within_themselves():
    # stage 1 (the last, with the loss head) is slower by design: no straggler there
    times = [0.10, 0.10, 0.30, 0.31]
    assert stragglers(times, [0, 0, 1, 1], 1.5) == []
    assert stragglers([0.10, 0.25, 0.30, 0.31], [0, 0, 1, 1], 1.5) == [(1, 0.25, 0.10)]


def test_timer_noise_below_a_millisecond_is_no_straggler():
    assert stragglers([0.0001, 0.0009], [0, 0], 1.5) == []


@pytest.mark.parametrize("factor", ["1", "0.5"])
def test_a_straggler_factor_of_at_most_one_is_refused(toy_site, factor):
    from loong_core.config.compose import load_config

    with pytest.raises(ConfigError, match=rf"'trainer.straggler_factor' = {float(factor)} would name ranks no "
                                          "slower than the others; use a ratio above 1"):
        load_config(["experiment=toy", f"trainer.straggler_factor={factor}"])


def test_the_record_sizes_give_the_size_of_a_checkpoint(tmp_path):
    path = _save(tmp_path, 2, _writer(12345))
    record = json.loads((path / store.COMPLETE_FILE).read_text())
    assert space.checkpoint_size(path) == sum(entry["size"] for entry in record["files"].values())
    assert space.checkpoint_size(path) >= 12345
