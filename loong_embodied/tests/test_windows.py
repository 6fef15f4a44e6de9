"""delta_timestamps windows: observation history and action chunks, padded at episode edges."""

from __future__ import annotations

import numpy as np
import pytest

from loong_core.errors import ConfigError
from loong_embodied.lerobot.dataset import LeRobotDataset
from loong_embodied.lerobot.windows import delta_indices, window_delta_timestamps


def test_history_at_episode_start_is_padded_with_the_first_frame(written):
    root, episodes = written
    ds = LeRobotDataset(root, delta_timestamps={"observation.state": [-0.2, -0.1, 0.0]})
    first_of_second = len(episodes[0])                # frame 0 of episode 1
    item = ds[first_of_second]
    assert item["observation.state_is_pad"].tolist() == [True, True, False]
    expected = episodes[1][0]["observation.state"]
    for t in range(3):
        np.testing.assert_array_equal(item["observation.state"][t], expected)
    inside = ds[first_of_second + 2]
    assert inside["observation.state_is_pad"].tolist() == [False, False, False]
    np.testing.assert_array_equal(inside["observation.state"][0], expected)


def test_action_chunk_at_episode_end_is_padded_with_the_last_action(written):
    root, episodes = written
    ds = LeRobotDataset(root, delta_timestamps={"action": [i / 10 for i in range(4)]})
    last_of_first = len(episodes[0]) - 2              # frames 5, 6 remain in episode 0
    item = ds[last_of_first]
    assert item["action"].shape == (4, 2)
    assert item["action_is_pad"].tolist() == [False, False, True, True]
    np.testing.assert_array_equal(item["action"][1], episodes[0][-1]["action"])
    np.testing.assert_array_equal(item["action"][3], episodes[0][-1]["action"])   # not episode 1's


def test_image_history_has_a_time_axis(written):
    root, _ = written
    ds = LeRobotDataset(root, delta_timestamps={"observation.image": [-0.1, 0.0]})
    assert ds[0]["observation.image"].shape == (2, 3, 16, 16)
    assert ds[0]["observation.image_is_pad"].tolist() == [True, False]


def test_offsets_that_are_not_whole_frames_are_rejected():
    with pytest.raises(ConfigError, match="not whole frames at 10"):
        delta_indices({"action": [0.0, 0.05]}, fps=10)


def test_window_delta_timestamps_builds_history_and_chunk():
    deltas = window_delta_timestamps(10, ["observation.state"], n_obs_steps=2, chunk_size=3)
    assert deltas == {"observation.state": [-0.1, 0.0], "action": [0.0, 0.1, 0.2]}
    assert window_delta_timestamps(10, ["observation.state"]) == {}
