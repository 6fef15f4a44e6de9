"""``loong data metaworld``: expert demonstrations recorded into LeRobot v3.0 (needs metaworld)."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("metaworld")
os.environ.setdefault("MUJOCO_GL", "egl")


def test_records_one_short_reach_episode_with_camera_images(tmp_path):
    from loong_embodied.lerobot.dataset import LeRobotDataset
    from loong_embodied.sim.record import record_metaworld

    summary = record_metaworld(tmp_path / "mw", ["reach-v3"], episodes=1, max_steps=6, only_success=False)
    assert (summary.episodes, summary.frames) == (1, 6)
    ds = LeRobotDataset(tmp_path / "mw", float_images=False)
    item = ds[0]
    assert ds.fps == 80 and ds.tasks == ["reach"]
    assert item["observation.state"].shape == (39,) and item["action"].shape == (4,)
    image = item["observation.image"]
    assert image.shape == (64, 64, 3) and image.std() > 5
    assert np.abs(item["action"]).max() <= 1.0


def test_recording_reproduces_the_lerobot_recorded_reach_episode(tmp_path, lerobot_metaworld):
    from loong_embodied.lerobot.dataset import LeRobotDataset
    from loong_embodied.sim.record import record_metaworld

    record_metaworld(tmp_path / "mw", ["reach-v3"], episodes=1, max_steps=4, only_success=False)
    ours = LeRobotDataset(tmp_path / "mw", float_images=False)
    theirs = LeRobotDataset(lerobot_metaworld, float_images=False, episodes=[10])   # reach, variation 0
    for i in range(4):
        np.testing.assert_allclose(ours[i]["observation.state"], theirs[i]["observation.state"], atol=1e-4)
        np.testing.assert_allclose(ours[i]["action"], theirs[i]["action"], atol=1e-5)
        diff = np.abs(ours[i]["observation.image"].astype(int) - theirs[i]["observation.image"])
        assert diff.mean() < 8, "images differ: flipped or another camera"
        flipped = np.abs(ours[i]["observation.image"][::-1].astype(int) - theirs[i]["observation.image"])
        assert flipped.mean() > 3 * diff.mean()                                          # upright, not flipped


def test_unknown_task_suggests_the_closest_name():
    from loong_core.errors import ConfigError
    from loong_embodied.sim.metaworld_env import MetaWorldTask

    with pytest.raises(ConfigError, match="Did you mean 'reach-v3'"):
        MetaWorldTask("reach-v2", camera=None)


def test_cli_records_under_the_shared_data_command_with_the_camera_as_video(tmp_path):
    import json
    import subprocess
    import sys

    from loong_embodied.lerobot.dataset import LeRobotDataset
    from loong_embodied.sim.record import record_metaworld

    pytest.importorskip("av")
    cmd = [sys.executable, "-m", "loong_core.cli.main", "data", "metaworld", "--tasks", "reach-v3", "--episodes",
           "1", "--max-steps", "3", "--keep-failures", "--video", str(tmp_path / "cli")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    summary = json.loads(out)
    assert (summary["episodes"], summary["frames"]) == (1, 3)
    video = LeRobotDataset(tmp_path / "cli", float_images=False)
    assert video.info.features["observation.image"]["dtype"] == "video"
    assert list((tmp_path / "cli" / "videos" / "observation.image").rglob("*.mp4"))
    # the same episode recorded as PNG images: the decoded frames are those images (codec error)
    record_metaworld(tmp_path / "png", ["reach-v3"], episodes=1, max_steps=3, only_success=False)
    png = LeRobotDataset(tmp_path / "png", float_images=False)
    for i in range(3):
        frame = video[i]["observation.image"].astype(int)
        diff = np.abs(frame - png[i]["observation.image"]).mean()
        assert diff < 6, (i, diff)   # measured 3.6 of 255 (AV1 at crf 30, 4:2:0 chroma)
        assert np.abs(frame[::-1] - png[i]["observation.image"]).mean() > 3 * diff
