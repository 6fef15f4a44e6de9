"""Faults of the world through ``loong train`` (issue 28): a disk that fills up during a save, a
read-only run directory, a rank made slow.

The full disk is a real one: a tmpfs mounted on ``<run dir>/checkpoints`` (the tests are skipped
where mounting is not permitted; ``loong_core/tests/test_disk_faults.py`` covers the same rules
in-process everywhere). Runs are ``llama_debug`` on the megatron engine, seconds each.
"""

from __future__ import annotations

import os
import re
import shutil
import socket

import pytest

from loong_core import testing_faults as faults
from loong_core.checkpoint import space
from loong_core.testing import install_plugin, losses, read_metrics, run_train

pytestmark = pytest.mark.crash_safety

COMMON = ["experiment=llama_debug", "trainer.log_interval=1", "trainer.eval_interval=0",
          "trainer.progress_bar=false", "trainer.tensorboard=false"]

# Rank SLOW_RANK sleeps SLOW_SECONDS after each leaf module's forward: a slower device, model-agnostic.
SLOW_RANK_PLUGIN = '''
import os
import time

import torch
from loong_core.hookspecs import hookimpl


def _sleep_after_leaf(module, args, output):
    if next(module.children(), None) is None:
        time.sleep(float(os.environ["SLOW_SECONDS"]))


@hookimpl
def loong_on_train_start(run):
    if run.rank == int(os.environ.get("SLOW_RANK", "-1")):
        torch.nn.modules.module.register_module_forward_hook(_sleep_after_leaf)
'''


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """6 steps with a checkpoint every 2 on a normal disk: ``(losses, bytes of one checkpoint)``."""
    run_dir = tmp_path_factory.mktemp("faults") / "reference"
    run_train([*COMMON, "trainer.train_iters=6", "trainer.save_interval=2", f"trainer.run_dir={run_dir}"])
    return losses(run_dir), space.checkpoint_size(run_dir / "checkpoints" / "iter_0000002")


def _log(proc) -> str:
    return proc.stdout + proc.stderr


def test_a_full_disk_fails_the_save_keeps_the_previous_checkpoint_and_training_goes_on(tmp_path, reference):
    ref, size = reference
    run_dir = tmp_path / "run"
    common = [*COMMON, "trainer.train_iters=6", "trainer.save_interval=2", f"trainer.run_dir={run_dir}"]
    with faults.small_filesystem(run_dir / "checkpoints", int(1.5 * size)) as disk:  # room for one
        proc = run_train(common, check=False)
        log = _log(proc)
        # step 4: refused (0.5 checkpoints free), logged, training continues with its state in memory
        assert "ERROR loong_core.trainer.loop: checkpoint of step 4 not saved (rank 0: [Errno 28] No space left on " \
               "device" in log, log[-3000:]
        assert "the newest complete checkpoint, iter_0000002, is kept" in log
        assert "Training continues; the next save is at step 6." in log
        # step 6, the last save, fails too: the run ends with an error saying where to resume
        assert proc.returncode == 2, log[-3000:]
        assert "error: checkpoint of step 6 not saved" in proc.stderr
        assert "trainer.resume=auto continues from the newest complete one" in proc.stderr
        assert sorted(p.name for p in disk.iterdir()) == ["iter_0000002"]  # no partial folder left
        assert losses(run_dir) == ref  # the failed save changed nothing in training
        records = {r["step"]: r for r in read_metrics(run_dir)}
        # counted from the record after the failure (step 4's record is written before its save)
        assert [records[s].get("checkpoint_save_failures", 0) for s in range(1, 7)] == [0, 0, 0, 0, 1, 1]

        resumed = run_train([*common, "trainer.resume=auto", "trainer.save_at_end=false",
                             "trainer.save_interval=0"])
        assert "resumed from" in _log(resumed) and "iter_0000002" in _log(resumed)
        assert losses(run_dir) == ref  # steps 3-6 again, bit for bit


@pytest.mark.multirank
def test_a_disk_that_fills_up_in_the_middle_of_a_dp2_save_fails_it_on_every_rank(tmp_path, reference):
    _, size = reference
    run_dir = tmp_path / "run"
    with faults.small_filesystem(run_dir / "checkpoints", int(0.7 * size)) as disk:  # the first save passes
        proc = run_train([*COMMON, "trainer.train_iters=4", "trainer.save_interval=2",  # the free-space check
                          f"trainer.run_dir={run_dir}"], nproc=2, check=False)
        log = _log(proc)
        assert "checkpoint of step 2 not saved (rank 0: [Errno 28] No space left on device" in log, log[-3000:]
        assert "there is no earlier checkpoint" in log
        assert sorted(losses(run_dir)) == [1, 2, 3, 4]  # both ranks went on after it
        assert proc.returncode != 0 and "error: checkpoint of step 4 not saved" in proc.stderr
        assert list(disk.iterdir()) == []
        assert space.free_bytes(disk) == shutil.disk_usage(disk).total  # every partial file removed


def test_a_read_only_run_directory_is_refused_before_the_model_is_built(tmp_path):
    run_dir = tmp_path / "run"
    with faults.read_only_folder(run_dir):
        proc = run_train([*COMMON, f"trainer.run_dir={run_dir}"], check=False, timeout=120)
    assert proc.returncode == 2
    assert (f"error: 'trainer.run_dir' = '{run_dir}': {run_dir} is not writable" in proc.stderr
            and "Make it writable (chmod u+w, or remount the filesystem read-write) or choose another "
                "trainer.run_dir" in proc.stderr), proc.stderr[-2000:]
    assert "building model" not in _log(proc) and "starting 1 rank" not in _log(proc)


@pytest.mark.multirank
def test_a_slow_rank_is_named_with_its_step_time_against_the_median(tmp_path):
    site = tmp_path / "site"
    install_plugin(site, "loong-test-slow-rank", "slow_rank", {"loong_test_slow_rank": SLOW_RANK_PLUGIN})
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "SLOW_RANK": "1", "SLOW_SECONDS": "0.002"}
    run_dir = tmp_path / "run"
    proc = run_train([*COMMON, "trainer.train_iters=4", "trainer.log_interval=2", "trainer.save_at_end=false",
                      f"trainer.run_dir={run_dir}"], nproc=2, env=env)
    named = re.findall(r"WARNING \S+: straggler: rank (\d+) \(host (\S+)\) step time ([\d.]+) s at step (\d+) "
                       r"against a median of ([\d.]+) s over the other ranks", _log(proc))
    print(named)
    assert [(rank, host, step) for rank, host, _, step, _ in named] == [("1", socket.gethostname(), "2"),
                                                                        ("1", socket.gethostname(), "4")]
    assert all(float(own) > 1.5 * float(median) for _, _, own, _, median in named)
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [2, 4] and all(r["straggler_ratio"] > 1.5 for r in records)
