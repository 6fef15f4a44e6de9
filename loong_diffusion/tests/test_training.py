"""Diffusion runs on the torch engine: DP layouts follow one rank, resume is exact, sampling works."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loong_core.testing import install_plugin, losses, run_train

STEPS = 6
CRASH = '''
import os
from loong_core.hookspecs import hookimpl

@hookimpl
def loong_on_log_step(run, step, metrics):
    if step == int(os.environ.get("CRASH_AT_STEP", "-1")):
        os._exit(17)
'''


@pytest.fixture(scope="module")
def wan_reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan")
    common = ["experiment=wan_debug", "trainer.progress_bar=false", "trainer.tensorboard=false",
              "model.cond_dropout=0.2"]
    run_train([*common, f"trainer.run_dir={root / 'ref'}"])
    return common, losses(root / "ref"), root


@pytest.mark.multirank
@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_wan_loss_on_two_ranks_equals_one_rank(wan_reference, layout):
    common, ref, root = wan_reference
    run_train([*common, f"parallel={layout}", f"trainer.run_dir={root / layout}"], nproc=2)
    got = losses(root / layout)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in got:
        assert got[step] == pytest.approx(ref[step], rel=1e-5, abs=1e-6), (layout, step, got, ref)


def test_resume_after_crash_reproduces_wan_losses_bit_for_bit(wan_reference, tmp_path):
    common, ref, _ = wan_reference
    site = tmp_path / "site"
    install_plugin(site, "loong-test-crash", "crash", {"loong_test_crash": CRASH})
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "LOONG_PLUGINS": "diffusion,crash", "CRASH_AT_STEP": "5"}
    run_dir = tmp_path / "crashed"
    args = [*common, "trainer.save_interval=3", f"trainer.run_dir={run_dir}"]
    assert run_train(args, env=env, check=False).returncode != 0
    run_train([*args, "trainer.resume=auto"])
    resumed = losses(run_dir)
    assert [resumed[s] for s in range(1, STEPS + 1)] == [ref[s] for s in range(1, STEPS + 1)]


def test_digits_debug_trains_and_loong_sample_writes_a_scored_grid(tmp_path, quiet):
    run_dir = tmp_path / "digits"
    run_train(["experiment=dit_digits_debug", *quiet, f"trainer.run_dir={run_dir}"])
    got = losses(run_dir)
    assert got[10] < got[1]
    out = tmp_path / "grid.png"
    proc = subprocess.run(
        [sys.executable, "-m", "loong_core.cli.main", "sample", "--checkpoint", str(run_dir),  # a run dir
         "--class", "0,3,7", "--per-class", "4", "--steps", "4", "--num-threads", "1",
         "--out", str(out), "--score"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sampling 12 samples with 4 Euler steps on cpu (1 threads)" in proc.stderr
    assert "sampling: step 4/4" in proc.stderr  # progress while it samples
    result = json.loads(proc.stdout)
    assert result["samples"] == 12 and result["score"]["classifier_accuracy_on_real"] > 0.95
    from PIL import Image

    assert Image.open(out).size == (4 * (8 * 4 + 1) + 1, 3 * (8 * 4 + 1) + 1)


def test_wan_sample_writes_a_gif(wan_reference, tmp_path):
    _, _, root = wan_reference
    import torch

    embeds = tmp_path / "prompt.pt"
    torch.save({"text_embeds": torch.randn(2, 8, 32), "text_mask": torch.ones(2, 8, dtype=torch.long)}, embeds)
    out = tmp_path / "clip.gif"
    proc = subprocess.run(
        [sys.executable, "-m", "loong_core.cli.main", "sample", "--checkpoint",
         str(root / "ref" / "checkpoints" / f"iter_{STEPS:07d}"), "--text-embeds", str(embeds), "--steps", "2",
         "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from PIL import Image

    assert Image.open(out).n_frames == 3
