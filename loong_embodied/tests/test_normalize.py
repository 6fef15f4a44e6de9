"""Normalisation from the dataset statistics."""

from __future__ import annotations

import numpy as np
import pytest

from loong_core.errors import ConfigError
from loong_embodied.lerobot.dataset import LeRobotDataset
from loong_embodied.lerobot.normalize import Normalizer


def test_mean_std_gives_zero_mean_unit_std_over_the_dataset(written):
    root, _ = written
    ds = LeRobotDataset(root, normalization={"observation.state": "mean_std"})
    states = np.stack([ds[i]["observation.state"] for i in range(len(ds))])
    np.testing.assert_allclose(states.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(states.std(0), 1.0, atol=1e-5)


def test_min_max_maps_the_range_to_minus_one_one_and_back(written):
    root, episodes = written
    ds = LeRobotDataset(root, normalization={"action": "min_max"})
    actions = np.stack([ds[i]["action"] for i in range(len(ds))])
    np.testing.assert_allclose(actions.min(0), -1.0, atol=1e-5)
    np.testing.assert_allclose(actions.max(0), 1.0, atol=1e-5)
    back = ds.normalizer.unnormalize("action", actions[3])
    np.testing.assert_allclose(back, episodes[0][3]["action"], atol=1e-5)


def test_lerobot_stats_normalise_the_shared_dataset(lerobot_metaworld):
    ds = LeRobotDataset(lerobot_metaworld, normalization={"observation.state": "mean_std", "action": "min_max"},
                        delta_timestamps={"action": [0.0, 1 / 80]})
    raw = LeRobotDataset(lerobot_metaworld)
    s = ds.stats["observation.state"]
    np.testing.assert_allclose(ds[10]["observation.state"],
                               (raw[10]["observation.state"] - s["mean"]) / (s["std"] + 1e-8), rtol=1e-4, atol=1e-4)
    assert np.abs(ds[10]["action"]).max() <= 1.0 + 1e-6


def test_unknown_mode_and_missing_stats_are_config_errors():
    stats = {"action": {"mean": np.zeros(2), "std": np.ones(2), "min": -np.ones(2), "max": np.ones(2)}}
    with pytest.raises(ConfigError, match="'z_score' is not one of mean_std, min_max, identity"):
        Normalizer(stats, {"action": "z_score"})
    with pytest.raises(ConfigError, match="no statistics for it"):
        Normalizer(stats, {"observation.state": "mean_std"})
