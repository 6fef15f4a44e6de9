"""``data=lerobot``: the registered data module feeding the trainer."""

from __future__ import annotations

import subprocess
import sys

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


def test_missing_path_names_the_fix():
    with pytest.raises(ConfigError, match="data.path is not set"):
        LeRobotDataModule(LeRobotDataConfig(name="lerobot"))


def test_plugin_and_cli_modules_do_not_import_torch():
    code = ("import sys, loong_embodied.plugin, loong_embodied.cli.data_cmd, loong_embodied.data.config;"
            "print('torch' in sys.modules, 'mujoco' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
