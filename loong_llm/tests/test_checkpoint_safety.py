"""Megatron-engine checkpoints through ``loong train`` and ``loong convert``: planted code never
runs, damaged files are named (and ``resume=auto`` passes over them), and non-finite losses,
gradients or weights never reach a checkpoint."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys

import pytest

from loong_core import testing_faults as faults
from loong_core.testing import install_plugin, losses, read_metrics, run_train

pytestmark = pytest.mark.crash_safety

STEPS = 8  # as the shared ``reference_run`` (checkpoints after steps 2, 4, 6, 8)

NAN_PLUGIN = '''
import os
from loong_core.hookspecs import hookimpl

@hookimpl
def loong_on_train_start(run):
    """Poison the loss of every micro batch of training step NAN_AT_STEP (a numerics accident)."""
    from loong_llm.families.common.provider import DecoderProvider

    at, original = int(os.environ.get("NAN_AT_STEP", "-1")), DecoderProvider.forward_step

    def forward_step(self, model, batch):
        output, loss_func = original(self, model, batch)
        if model.training and run.iteration + 1 == at:
            output = output * float("nan")
        return output, loss_func

    DecoderProvider.forward_step = forward_step
'''


@pytest.fixture(scope="module")
def source(reference_run):
    return reference_run


@pytest.fixture(scope="module")
def nan_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("nan_site")
    install_plugin(site, "loong-test-nan", "nan", {"loong_test_nan": NAN_PLUGIN})
    return os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


def _copy(source, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(source, target)
    return target


def _convert(checkpoint, out):
    return subprocess.run([sys.executable, "-m", "loong_core.cli.main", "convert", "loong-to-hf",
                           str(checkpoint), str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


PLANTS = {
    "metadata": (lambda ckpt, marker: faults.plant_in_metadata(ckpt, marker), ".metadata"),
    "extra_state": (lambda ckpt, marker: faults.plant_in_shard_object(ckpt, marker, "_extra_state"), ".distcp"),
    "rng": (lambda ckpt, marker: faults.plant_in_torch_file(ckpt / "rng" / "rank_00000.pt", marker),
            "rank_00000.pt"),
}


@pytest.mark.parametrize("path, where", [("resume", "metadata"), ("resume", "extra_state"),
                                         ("init_from", "extra_state"), ("convert", "metadata")])
def test_planted_payload_never_runs(tiny, source, tmp_path, path, where):
    run_dir = _copy(source, tmp_path)
    checkpoint = run_dir / "checkpoints" / "iter_0000002"
    marker = tmp_path / "payload_ran"
    plant, named = PLANTS[where]
    plant(checkpoint, marker)
    if path == "convert":
        proc = _convert(checkpoint, tmp_path / "hf")
    else:
        proc = run_train([*tiny, "trainer.train_iters=3", f"trainer.run_dir={tmp_path / 'new'}",
                          f"trainer.{path}={checkpoint}"], check=False)
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith(f"error: {checkpoint}/") and named in message, proc.stderr[-3000:]
    assert "does not unpickle" in message
    assert not marker.exists()


def test_megatron_common_state_loads_weights_only(source, tmp_path):
    from loong_core.checkpoint.restricted import _common_strategy
    from loong_core.errors import CheckpointError

    checkpoint = _copy(source, tmp_path) / "checkpoints" / "iter_0000002"
    assert _common_strategy().load_common(checkpoint)["loong"]["iteration"] == 2
    faults.plant_in_torch_file(checkpoint / "common.pt", tmp_path / "ran")
    with pytest.raises(CheckpointError, match="common.pt: holds objects other than tensors"):
        _common_strategy().load_common(checkpoint)
    assert not (tmp_path / "ran").exists()


def test_shard_with_scaled_weights_is_refused_by_name(tiny, source, tmp_path):
    checkpoint = _copy(source, tmp_path) / "checkpoints" / "iter_0000008"
    shard, key = faults.scale_tensor(checkpoint, 1.5, contains="decoder.layers")
    proc = run_train([*tiny, "trainer.train_iters=9", f"trainer.run_dir={tmp_path / 'new'}",
                      f"trainer.resume={checkpoint}"], check=False)
    assert proc.returncode != 0
    assert f"error: {checkpoint / shard} was changed after it was written" in proc.stderr


def test_resume_auto_falls_back_past_a_truncated_checkpoint_and_says_so(tiny, source, tmp_path):
    run_dir = _copy(source, tmp_path)
    newest = run_dir / "checkpoints" / "iter_0000008"
    faults.truncate(newest / "__0_0.distcp")
    proc = run_train([*tiny, f"trainer.train_iters={STEPS}", f"trainer.run_dir={run_dir}", "trainer.resume=auto"])
    output = proc.stdout + proc.stderr
    assert f"{newest}/__0_0.distcp is truncated" in output
    assert "falling back to" in output and "iter_0000006, the newest intact checkpoint" in output
    reference, resumed = losses(source), losses(run_dir)
    assert [resumed[s] for s in (7, 8)] == [reference[s] for s in (7, 8)]


def test_nan_step_is_skipped_and_counted_when_exit_on_nan_is_false(tiny, source, nan_site, tmp_path):
    run_dir = tmp_path / "nan"
    run_train([*tiny, f"trainer.train_iters={STEPS}", "trainer.save_interval=4", "trainer.exit_on_nan=false",
               f"trainer.run_dir={run_dir}"], env={"PYTHONPATH": nan_site, "NAN_AT_STEP": "2"})
    records = {r["step"]: r for r in read_metrics(run_dir)}
    reference = {r["step"]: r for r in read_metrics(source)}
    assert [records[s]["skipped_steps"] for s in range(1, STEPS + 1)] == [0] + [1] * (STEPS - 1)
    assert records[2]["loss"] is None  # non-finite values are written as null
    assert all(math.isfinite(records[s]["loss"]) for s in range(1, STEPS + 1) if s != 2)
    assert records[1]["loss"] == reference[1]["loss"]
    assert records[3]["lr"] == reference[2]["lr"]  # the skipped step did not advance the schedule
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_0000004", "iter_0000008"]


def test_nan_step_stops_the_run_naming_the_step_and_the_last_good_checkpoint(tiny, nan_site, tmp_path):
    run_dir = tmp_path / "nan"
    proc = run_train([*tiny, f"trainer.train_iters={STEPS}", "trainer.save_interval=2",
                      f"trainer.run_dir={run_dir}"], env={"PYTHONPATH": nan_site, "NAN_AT_STEP": "3"}, check=False)
    assert proc.returncode != 0
    good = run_dir / "checkpoints" / "iter_0000002"
    assert "non-finite values at step 3" in proc.stderr
    assert f"The last good checkpoint is {good}" in proc.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_0000002"]


@pytest.mark.parametrize("exit_on_nan, message", [
    ("true", r"validation loss is nan at step 1"),
    ("false", r"no checkpoint was written at step 1: the validation loss at step 1 was nan")])
def test_diverging_run_never_writes_a_checkpoint(tiny, tmp_path, exit_on_nan, message):
    """optim.lr=1e10: the first update blows the weights up (still finite), so the
    validation loss is NaN; before this the run exited 0 and saved that model."""
    run_dir = tmp_path / "diverged"
    proc = run_train([*tiny, "optim.lr=1e10", "optim.min_lr=0", "optim.lr_warmup_iters=0", "trainer.train_iters=1",
                      "trainer.eval_interval=1", "trainer.eval_iters=1", f"trainer.exit_on_nan={exit_on_nan}",
                      f"trainer.run_dir={run_dir}"], check=False)
    assert proc.returncode != 0
    assert re.search(message, proc.stderr), proc.stderr[-3000:]
    assert not (run_dir / "checkpoints").exists() or not list((run_dir / "checkpoints").iterdir())
