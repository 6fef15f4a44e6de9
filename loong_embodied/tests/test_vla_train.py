"""``pi05_debug``, ``groot_debug``, ``groot_n16_debug``, ``xvla_debug`` and ``wam_debug`` as real
``loong train`` jobs on the shared Meta-World dataset: training, checkpoints and resuming, FSDP2
over 2 ranks against one rank (GR00T as N1.6, whose top backbone layer trains inside the sharded
model, on state-relative actions), and a closed-loop rollout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from loong_core.testing import losses, run_train

POLICIES = ["pi05", "groot", "groot_n16", "xvla", "wam"]
STEPS = 3
ENV = {"LOONG_PLUGINS": "embodied"}


def _overrides(policy: str, dataset, run_dir, *extra: str) -> list[str]:
    # GR00T N1.6 trains on state-relative hand positions (its relative action chunks)
    relative = ["data.relative_action_dims=[0,1,2]"] if policy == "groot_n16" else []
    return [f"experiment={policy}_debug", f"data.path={dataset}", f"trainer.run_dir={run_dir}",
            f"trainer.train_iters={STEPS}", "trainer.save_interval=2", "trainer.progress_bar=false",
            "trainer.tensorboard=false", *relative, *extra]


@pytest.fixture(scope="module", params=POLICIES)
def one_rank(request, lerobot_metaworld, tmp_path_factory):
    """``(policy, dataset, run_dir)`` of a 3-step one-rank run (checkpoints at steps 2 and 3)."""
    run_dir = tmp_path_factory.mktemp(request.param) / "run"
    run_train(_overrides(request.param, lerobot_metaworld, run_dir), env=ENV, timeout=300)
    return request.param, lerobot_metaworld, run_dir


def test_debug_experiment_trains_and_writes_checkpoints(one_rank):
    _, _, run_dir = one_rank
    steps = losses(run_dir)
    assert sorted(steps) == [1, 2, 3] and all(0.0 < v < 10.0 for v in steps.values())
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_0000002", "iter_0000003"]


def test_resuming_from_step_2_reproduces_step_3(one_rank, tmp_path):
    policy, dataset, run_dir = one_rank
    resumed = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed)
    shutil.rmtree(resumed / "checkpoints" / "iter_0000003")
    (resumed / "metrics.jsonl").unlink()
    run_train(_overrides(policy, dataset, resumed, "trainer.resume=auto"), env=ENV, timeout=300)
    assert losses(resumed) == {3: losses(run_dir)[3]}


# wam's FSDP2 units are loong_diffusion's DiT blocks, whose FSDP2 run loong_diffusion's tests follow
@pytest.mark.multirank
@pytest.mark.parametrize("one_rank", ["pi05", "groot_n16", "xvla"], indirect=True)
def test_fsdp2_over_two_ranks_follows_one_rank(one_rank, tmp_path):
    policy, dataset, run_dir = one_rank
    run_train(_overrides(policy, dataset, tmp_path / "fsdp2", "parallel=fsdp", "trainer.save_at_end=false"),
              nproc=2, env=ENV, timeout=300)
    one, fsdp2 = losses(run_dir), losses(tmp_path / "fsdp2")
    assert sorted(fsdp2) == sorted(one)
    for step in one:
        assert fsdp2[step] == pytest.approx(one[step], abs=1e-5, rel=1e-5), (step, fsdp2, one)


@pytest.mark.parametrize("one_rank", ["pi05", "wam"], indirect=True)   # one VLA and the world-action model
def test_rollout_runs_a_trained_vla_checkpoint_in_metaworld(one_rank):
    pytest.importorskip("metaworld")
    _, _, run_dir = one_rank
    cmd = [sys.executable, "-m", "loong_core.cli.main", "eval", "rollout", "--checkpoint", str(run_dir),
           "--tasks", "reach-v3", "--episodes", "1", "--max-steps", "6"]
    env = {**os.environ, **ENV, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["task", "episodes", "successes", "success", "mean", "steps"]
    assert lines[2].split()[:2] == ["reach-v3", "1"] and lines[3].startswith("mean")


@pytest.mark.parametrize("one_rank", ["groot_n16"], indirect=True)
def test_a_state_relative_policy_adds_the_state_it_acts_from(one_rank, monkeypatch):
    """The run trained on hand positions relative to the state: the executed action is the
    predicted offset (un-normalised with the offsets' statistics) plus the current state there,
    the gripper command as predicted."""
    import numpy as np
    import torch

    from loong_embodied.eval.policy import LoadedPolicy

    _, _, run_dir = one_rank
    policy = LoadedPolicy(run_dir)
    assert policy.relative.action_dims.tolist() == [0, 1, 2]
    monkeypatch.setattr(policy.model, "sample",   # a fixed prediction: only the state moves the action
                        lambda batch, generator=None: torch.zeros(1, policy.config.chunk_size, 4))
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    state = np.random.default_rng(0).uniform(-0.5, 0.5, 39).astype(np.float32)
    first = policy.act(state, image)
    policy.reset("")
    moved = state + np.float32(0.25)
    second = policy.act(moved, image)
    np.testing.assert_allclose(second[:3] - first[:3], 0.25, atol=1e-6)
    assert second[3] == first[3]
    np.testing.assert_allclose(first, policy.normalizer.unnormalize("action", np.zeros(4, np.float32))
                               + np.r_[state[:3], 0], atol=1e-6)
