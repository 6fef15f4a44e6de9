"""loong's native reader on a dataset written by LeRobot 0.4.4 itself (format v3.0)."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from loong_embodied.lerobot.dataset import LeRobotDataset


def test_reads_episodes_frames_and_tasks_of_the_lerobot_written_dataset(lerobot_metaworld):
    ds = LeRobotDataset(lerobot_metaworld)
    assert ds.info.version == "v3.0" and ds.fps == 80
    assert (len(ds), ds.num_episodes) == (766, 12)
    assert ds.tasks == ["button press topdown", "door open", "drawer close", "pick place", "push", "reach"]
    assert ds.episodes.length.tolist()[:2] == [64, 71] and ds.episodes.length.sum() == 766
    assert ds.episodes.tasks[10] == ["reach"]


def test_frame_holds_state_action_image_and_its_task(lerobot_metaworld):
    ds = LeRobotDataset(lerobot_metaworld)
    item = ds[700]                                   # episode 10 (reach) starts at 671
    assert item["observation.state"].shape == (39,) and item["action"].shape == (4,)
    assert item["observation.image"].shape == (3, 64, 64) and item["observation.image"].dtype == np.float32
    assert 0.0 <= item["observation.image"].min() and item["observation.image"].max() <= 1.0
    assert (int(item["episode_index"]), int(item["frame_index"]), item["task"]) == (10, 29, "reach")
    assert np.isclose(item["timestamp"], 29 / 80)


def test_images_decode_to_the_embedded_png(lerobot_metaworld):
    ds = LeRobotDataset(lerobot_metaworld, float_images=False)
    cell = pq.read_table(next((lerobot_metaworld / "data").glob("*/*.parquet")),
                         columns=["observation.image"]).slice(5, 1).to_pylist()[0]["observation.image"]
    expected = np.asarray(Image.open(io.BytesIO(cell["bytes"])).convert("RGB"))
    np.testing.assert_array_equal(ds[5]["observation.image"], expected)


def test_stats_match_stats_json(lerobot_metaworld):
    ds = LeRobotDataset(lerobot_metaworld)
    raw = json.loads((lerobot_metaworld / "meta" / "stats.json").read_text())
    np.testing.assert_allclose(ds.stats["action"]["mean"], raw["action"]["mean"])
    assert ds.stats["observation.state"]["std"].shape == (39,)
    assert ds.stats["observation.image"]["mean"].shape == (3, 1, 1)
    states = np.stack([ds[i]["observation.state"] for i in range(len(ds))])
    np.testing.assert_allclose(states.mean(0), ds.stats["observation.state"]["mean"], atol=1e-5)


def test_episode_selection_keeps_only_those_frames(lerobot_metaworld):
    ds = LeRobotDataset(lerobot_metaworld, episodes=[10, 11])
    assert len(ds) == 51 + 44
    assert {int(ds[i]["episode_index"]) for i in range(len(ds))} == {10, 11}
