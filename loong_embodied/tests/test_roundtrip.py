"""loong's writer produces LeRobot format v3.0 that reads back to identical frames."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loong_embodied.lerobot.dataset import LeRobotDataset
from loong_embodied.lerobot.format import LeRobotFormatError

from .conftest import FEATURES, make_frames, write_dataset


def test_write_then_read_gives_identical_frames(written):
    root, episodes = written
    ds = LeRobotDataset(root, float_images=False)
    frames = [f for ep in episodes for f in ep]
    assert len(ds) == len(frames) == 16 and ds.num_episodes == 3
    for i, frame in enumerate(frames):
        item = ds[i]
        for key in FEATURES:
            np.testing.assert_array_equal(item[key], frame[key], err_msg=f"{key} of frame {i}")
        assert item["task"] == frame["task"]


def test_written_layout_is_lerobot_v3(written):
    root, _ = written
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 3 and info["total_frames"] == 16
    assert set(info["features"]) >= {"timestamp", "frame_index", "episode_index", "index", "task_index"}
    assert (root / "data" / "chunk-000" / "file-000.parquet").is_file()
    tasks = pq.read_table(root / "meta" / "tasks.parquet")
    assert tasks.column_names == ["task_index", "__index_level_0__"]
    assert tasks.column("__index_level_0__").to_pylist() == ["reach", "push"]
    schema = pq.read_schema(root / "data" / "chunk-000" / "file-000.parquet")
    assert str(schema.field("observation.image").type) == "struct<bytes: binary, path: string>"
    assert schema.field("action").type == pa.list_(pa.float32(), 2)      # as LeRobot writes it
    episodes = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    assert episodes.column("dataset_to_index").to_pylist() == [7, 11, 16]
    assert "stats/action/mean" in episodes.column_names


def test_stats_are_exact_mean_and_std_of_the_frames(written):
    root, episodes = written
    ds = LeRobotDataset(root)
    actions = np.stack([f["action"] for ep in episodes for f in ep]).astype(np.float64)
    np.testing.assert_allclose(ds.stats["action"]["mean"], actions.mean(0), rtol=1e-6)
    np.testing.assert_allclose(ds.stats["action"]["std"], actions.std(0), rtol=1e-6)
    np.testing.assert_allclose(ds.stats["action"]["min"], actions.min(0), rtol=1e-6)


def test_v21_layout_reads_the_same_frames(written, tmp_path):
    root, episodes = written
    v21 = _as_v21(root, tmp_path / "v21", episodes)
    a, b = LeRobotDataset(root, float_images=False), LeRobotDataset(v21, float_images=False)
    assert b.info.version == "v2.1" and len(b) == len(a) and b.tasks == a.tasks
    for i in range(len(a)):
        for key in FEATURES:
            np.testing.assert_array_equal(a[i][key], b[i][key])
    np.testing.assert_allclose(b.stats["action"]["mean"], a.stats["action"]["mean"], rtol=1e-6)


def test_video_feature_round_trip_within_codec_error(tmp_path):
    pytest.importorskip("av")
    features = {**FEATURES, "observation.wrist": {"dtype": "video", "shape": [16, 16, 3],
                                                   "names": ["height", "width", "channel"]}}
    episodes = make_frames(1)
    for ep in episodes:
        for i, frame in enumerate(ep):
            frame["observation.wrist"] = np.full((16, 16, 3), 30 * i, dtype=np.uint8)
    root = write_dataset(tmp_path / "video", episodes, features)
    ds = LeRobotDataset(root, float_images=False, delta_timestamps={"observation.wrist": [-0.1, 0.0]})
    frames = [f for ep in episodes for f in ep]
    for i in (0, 3, 8, 15):
        got = ds[i]["observation.wrist"][1].astype(int)
        assert np.abs(got - frames[i]["observation.wrist"]).max() <= 3, f"frame {i}"


def test_writer_refuses_a_frame_of_the_wrong_shape(tmp_path):
    from loong_embodied.lerobot.writer import LeRobotWriter

    writer = LeRobotWriter(tmp_path / "bad", fps=10, features=FEATURES)
    frame = make_frames()[0][0]
    with pytest.raises(LeRobotFormatError, match=r"'action' has shape \(3,\), but was declared \[2\]"):
        writer.add_frame({**frame, "action": np.zeros(3, np.float32)})


def _as_v21(root, out, episodes):
    """Re-lay loong's v3.0 output as LeRobot v2.1: one parquet per episode, jsonl metadata."""
    import pyarrow.compute as pc

    (out / "meta").mkdir(parents=True)
    info = json.loads((root / "meta" / "info.json").read_text())
    info.update(codebase_version="v2.1", data_path="data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet")
    (out / "meta" / "info.json").write_text(json.dumps(info))
    table = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet")
    (out / "data" / "chunk-000").mkdir(parents=True)
    tasks = ["reach", "push"]
    ep_rows, stat_rows = [], []
    ep_table = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    for e, frames in enumerate(episodes):
        part = table.filter(pc.equal(table.column("episode_index"), e))
        pq.write_table(part, out / "data" / "chunk-000" / f"episode_{e:06d}.parquet")
        ep_rows.append({"episode_index": e, "tasks": [frames[0]["task"]], "length": len(frames)})
        stats = {k.split("/")[1]: {} for k in ep_table[e] if k.startswith("stats/")}
        for k, v in ep_table[e].items():
            if k.startswith("stats/"):
                stats[k.split("/")[1]][k.split("/")[2]] = v
        stat_rows.append({"episode_index": e, "stats": stats})
    write = lambda name, rows: (out / "meta" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    write("episodes.jsonl", ep_rows)
    write("tasks.jsonl", [{"task_index": i, "task": t} for i, t in enumerate(tasks)])
    write("episodes_stats.jsonl", stat_rows)
    shutil.rmtree(out / "videos", ignore_errors=True)
    return out
