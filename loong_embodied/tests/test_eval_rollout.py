"""``loong eval rollout``: a 2-step checkpoint, trained on demonstrations recorded on first use,
run closed-loop in Meta-World (needs metaworld)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loong_core.testing import losses, run_train

pytest.importorskip("metaworld")

# Only this plugin (and core): the test does not depend on which other plugins are installed.
ENV = {"LOONG_PLUGINS": "embodied", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory):
    """A 2-step flow_policy_debug run whose data (1 episode each of reach and push) prepare() recorded."""
    root = tmp_path_factory.mktemp("rollout")
    run_dir = root / "run"
    run_train(["experiment=flow_policy_debug", "data.record_metaworld=[reach-v3,push-v3]", "data.record_episodes=1",
               f"data.cache_dir={root / 'cache'}", f"trainer.run_dir={run_dir}", "trainer.progress_bar=false",
               "trainer.tensorboard=false"], env=ENV, timeout=300)
    return root, run_dir


def _rollout(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "loong_core.cli.main", "eval", "rollout", "--env", "metaworld",
           "--tasks", "reach-v3,push-v3", "--episodes", "1", "--max-steps", "6", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, **ENV})


def test_prepare_records_the_demonstrations_into_the_cache_on_first_use(debug_run):
    root, run_dir = debug_run
    datasets = list((root / "cache" / "metaworld").iterdir())
    assert [d.name for d in datasets] == ["reach_push-1ep-seed0-state"]
    assert (datasets[0] / "meta" / "info.json").is_file() and (datasets[0] / "manifest.json").is_file()
    assert sorted(losses(run_dir)) == [1, 2]


def test_a_damaged_recording_is_recorded_again_with_a_warning(debug_run, tmp_path, caplog):
    import logging
    import shutil

    from loong_core.data.manifest import damage
    from loong_embodied.data.config import LeRobotDataConfig
    from loong_embodied.data.module import LeRobotDataModule

    root, _ = debug_run
    shutil.copytree(root / "cache", tmp_path / "cache")
    config = LeRobotDataConfig(name="lerobot", record_metaworld=["reach-v3", "push-v3"],
                               record_episodes=1, cache_dir=str(tmp_path / "cache"))
    module = LeRobotDataModule(config)
    (folder,) = (tmp_path / "cache" / "metaworld").iterdir()
    frames = next((folder / "data").rglob("*.parquet"))
    frames.write_bytes(frames.read_bytes()[:100])
    with caplog.at_level(logging.WARNING):
        module.prepare()
    assert f"the Meta-World recording in {folder} is damaged" in caplog.text
    assert damage(folder) is None
    module.setup()


def test_rollout_prints_a_success_rate_table_and_saves_a_gif(debug_run):
    root, run_dir = debug_run
    gif = root / "episode.gif"
    proc = _rollout("--checkpoint", str(run_dir), "--gif", str(gif))
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["task", "episodes", "successes", "success", "mean", "steps"]
    assert [line.split()[:2] for line in lines[2:4]] == [["reach-v3", "1"], ["push-v3", "1"]]
    assert lines[4].startswith("mean")
    assert gif.stat().st_size > 1000 and gif.read_bytes()[:6] == b"GIF89a"
    # progress while it runs, and the thread count the run trained with (none set: 1 for batch-1 inference)
    assert "rollout episodes: step 2/2" in proc.stderr
    assert "1 CPU thread(s)" in proc.stderr


def test_rollout_json_reports_each_task_from_a_checkpoint_directory(debug_run):
    _, run_dir = debug_run
    proc = _rollout("--checkpoint", str(run_dir / "checkpoints" / "iter_0000002"), "--json", "--seed", "7",
                    "--num-threads", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "2 CPU thread(s)" in proc.stderr
    report = json.loads(proc.stdout)
    assert [t["task"] for t in report["tasks"]] == ["reach-v3", "push-v3"]
    for task in report["tasks"]:
        assert task["episodes"] == 1 and task["successes"] in (0, 1) and 1 <= task["mean_steps"] <= 6
    assert report["seed"] == 7 and report["action_steps"] == 4 and 0.0 <= report["mean_success_rate"] <= 1.0


def test_rollout_names_the_fix_for_a_path_without_checkpoints(tmp_path):
    from loong_core.errors import ConfigError
    from loong_embodied.eval.policy import resolve_checkpoint

    with pytest.raises(ConfigError, match="expected a run directory"):
        resolve_checkpoint(tmp_path)


def test_rollout_of_a_language_model_run_is_one_clear_error(tmp_path):
    pytest.importorskip("loong_llm")
    from loong_core.errors import ConfigError
    from loong_embodied.eval.policy import build_policy

    with pytest.raises(ConfigError, match="not a robot policy"):
        build_policy({"name": "llama"}, tmp_path)
