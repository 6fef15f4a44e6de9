"""``data=lerobot``: the registered data module feeding the trainer."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from loong_core.errors import ConfigError
from loong_embodied.data.config import LeRobotDataConfig
from loong_embodied.data.module import LeRobotDataModule


def test_module_yields_tensors_with_chunks_and_history(lerobot_metaworld):
    module = LeRobotDataModule(LeRobotDataConfig(name="lerobot", path=str(lerobot_metaworld), n_obs_steps=2,
                                                 chunk_size=8, valid_episodes=2))
    module.prepare()
    module.setup()
    overrides = module.model_overrides()
    assert overrides["state_dim"] == 39 and overrides["action_dim"] == 4
    assert overrides["chunk_size"] == 8 and overrides["n_obs_steps"] == 2 and overrides["num_tasks"] == 6
    assert overrides["image_size"] == [3, 64, 64] and overrides["image_keys"] == ["observation.image"]
    train, valid = module.build(100, 10, seed=1)
    assert len(train) == 100 and len(module.valid_frames) == 51 + 44     # the two reach episodes held out
    item = train[0]
    assert item["observation.state"].shape == (2, 39) and item["action"].shape == (8, 4)
    assert item["action_is_pad"].dtype == torch.bool and item["observation.image"].shape == (2, 3, 64, 64)
    again, _ = module.build(100, 10, seed=1)
    assert torch.equal(again[7]["action"], train[7]["action"])          # item i is a function of the seed


def test_state_relative_actions_are_offsets_from_the_current_state(lerobot_metaworld):
    common = dict(name="lerobot", path=str(lerobot_metaworld), n_obs_steps=2, chunk_size=8, valid_episodes=2,
                  image_keys=[])
    plain, relative = (LeRobotDataModule(LeRobotDataConfig(**common, **extra))
                       for extra in ({}, {"relative_action_dims": [0, 1, 2]}))
    plain.setup()
    relative.setup()
    a_norm, r_norm = plain.frames.normalizer, relative.frames.normalizer
    for i in (0, 57, 300):
        a, r = plain.frames[i], relative.frames[i]
        state = a_norm.unnormalize("observation.state", a["observation.state"][-1])   # the current frame's
        absolute, offsets = a_norm.unnormalize("action", a["action"]), r_norm.unnormalize("action", r["action"])
        np.testing.assert_allclose(offsets[:, :3] + state[:3], absolute[:, :3], atol=1e-4)
        np.testing.assert_array_equal(r["action"][:, 3], a["action"][:, 3])           # the gripper: as recorded
        np.testing.assert_array_equal(r["observation.state"], a["observation.state"])
    # min_max over the offsets' own statistics: every chunk inside [-1, 1], the extremes reached
    chunks = np.stack([relative.frames[i]["action"] for i in range(len(relative.frames))])
    assert np.abs(chunks).max() <= 1 + 1e-5 and np.abs(chunks[..., :3]).max(axis=(0, 1)).min() > 0.999
    # mean_std over the same statistics: the offsets of every frame's whole chunk have mean 0, std 1
    standard = LeRobotDataModule(LeRobotDataConfig(**common, relative_action_dims=[0, 1, 2], normalization={
        "observation.state": "mean_std", "action": "mean_std"}))
    standard.setup()
    chunks = np.stack([standard.frames[i]["action"] for i in range(len(standard.frames))]).reshape(-1, 4)
    np.testing.assert_allclose(chunks[:, :3].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(chunks[:, :3].std(0), 1, atol=1e-4)


@pytest.mark.parametrize("extra, match", [
    (dict(relative_action_dims=[]), "relative_action_dims is empty"),
    (dict(relative_action_dims=[4]), r"relative_action_dims=\[4\]: \[4\] outside 0..3"),
    (dict(relative_action_dims=[0, 0]), "repeats a dimension"),
    (dict(relative_action_dims=[0, 1], relative_state_dims=[2]), "relative_state_dims has 1 entries for 2"),
    (dict(relative_action_dims=[0], relative_state_dims=[39]), r"\[39\] outside 0..38"),
    (dict(relative_action_dims=[0], delta_timestamps={"observation.state": [-0.025, -0.0125], "action": [0.0]}),
     "must include offset 0"),
])
def test_bad_relative_action_dims_name_the_setting(lerobot_metaworld, extra, match):
    module = LeRobotDataModule(LeRobotDataConfig(name="lerobot", path=str(lerobot_metaworld), **extra))
    with pytest.raises(ConfigError, match=match):
        module.setup()


def test_missing_path_names_the_fix():
    with pytest.raises(ConfigError, match="data.path is not set"):
        LeRobotDataModule(LeRobotDataConfig(name="lerobot"))


def test_plugin_and_cli_modules_do_not_import_torch():
    code = ("import sys, loong_embodied.plugin, loong_embodied.cli.data_cmd, loong_embodied.data.config;"
            "print('torch' in sys.modules, 'mujoco' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
