"""Write datasets in LeRobot's format v3.0: frames go in with ``add_frame``, episode by episode.

::

    writer = LeRobotWriter(out_dir, fps=80, features={
        "observation.image": {"dtype": "image", "shape": [64, 64, 3], "names": ["height", "width", "channel"]},
        "observation.state": {"dtype": "float32", "shape": [39], "names": None},
        "action": {"dtype": "float32", "shape": [4], "names": None}})
    for step in episode:
        writer.add_frame({"observation.image": img, "observation.state": s, "action": a, "task": "reach"})
    writer.save_episode()
    writer.finalize()          # meta/info.json, meta/stats.json, meta/tasks.parquet, episode table

Images are embedded in the parquet files as PNG (lossless); ``"dtype": "video"`` features are
encoded as one mp4 per episode (needs PyAV).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loong_embodied.lerobot import arrow
from loong_embodied.lerobot.format import V30, LeRobotFormatError
from loong_embodied.lerobot.stats import aggregate_stats, feature_stats, stats_to_json

logger = logging.getLogger(__name__)

DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
INDEX_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


class LeRobotWriter:
    """Writes one LeRobot v3.0 dataset into an empty (or new) folder.

    Args:
        root: Output folder.
        fps: Frames per second.
        features: Recorded features (name -> ``{"dtype", "shape", "names"}``), without the index
            columns (timestamp, frame_index, episode_index, index, task_index), which are added.
        robot_type: Free text stored in ``info.json``.
        chunks_size: Files per chunk folder.
        data_files_size_in_mb: A data file is closed once its episodes exceed this size.
    """

    def __init__(self, root: str | Path, fps: int, features: dict, robot_type: str | None = None,
                 chunks_size: int = 1000, data_files_size_in_mb: int = 100):
        self.root = Path(root)
        if self.root.exists() and any(self.root.iterdir()):
            raise LeRobotFormatError(f"output folder {self.root} is not empty; choose a new folder")
        self.fps, self.robot_type, self.chunks_size = fps, robot_type, chunks_size
        self.max_file_bytes = data_files_size_in_mb * 1024 * 1024
        self.features = {**features, **INDEX_FEATURES}
        self.user_keys = list(features)
        self.tasks: list[str] = []
        self.episode_rows: list[dict] = []
        self.episode_stats: list[dict] = []
        self._frames: list[dict] = []
        self._pending: list[pa.Table] = []
        self._file_counter = 0
        self._video_counter = 0
        self._total_frames = 0

    # -- recording ---------------------------------------------------------------------------
    def add_frame(self, frame: dict) -> None:
        """Buffer one frame: every recorded feature plus ``task`` (the instruction string)."""
        missing = [k for k in [*self.user_keys, "task"] if k not in frame]
        if missing:
            raise LeRobotFormatError(f"frame is missing {missing}; a frame needs {[*self.user_keys, 'task']}")
        for key in self.user_keys:
            shape = tuple(self.features[key]["shape"])
            got = np.shape(frame[key])
            if got != shape and not (shape == (1,) and got in ((), (1,))):
                raise LeRobotFormatError(f"feature '{key}' has shape {got}, but was declared {list(shape)}")
        self._frames.append(frame)

    def save_episode(self) -> int:
        """Close the buffered frames as one episode; returns its ``episode_index``."""
        if not self._frames:
            raise LeRobotFormatError("save_episode() called without frames; add_frame() first")
        episode, n, start = len(self.episode_rows), len(self._frames), self._total_frames
        task = self._frames[0]["task"]
        if task not in self.tasks:
            self.tasks.append(task)
        columns = {key: np.stack([np.asarray(f[key]) for f in self._frames]) for key in self.user_keys}
        columns["timestamp"] = (np.arange(n) / self.fps).astype(np.float32)
        columns["frame_index"] = np.arange(n)
        columns["episode_index"] = np.full(n, episode)
        columns["index"] = np.arange(start, start + n)
        columns["task_index"] = np.full(n, self.tasks.index(task))
        stats = {key: feature_stats(values if self.features[key]["dtype"] in ("image", "video") else
                                    values.reshape(n, -1)) for key, values in columns.items()}
        row = {"episode_index": episode, "tasks": [task], "length": n}
        row.update(self._write_videos(columns, n))
        table = self._frame_table(columns, start)
        if self._pending and sum(t.nbytes for t in self._pending) + table.nbytes > self.max_file_bytes:
            self._flush()
        self._pending.append(table)
        chunk, file = divmod(self._file_counter, self.chunks_size)
        row.update({"data/chunk_index": chunk, "data/file_index": file,
                    "dataset_from_index": start, "dataset_to_index": start + n})
        self.episode_rows.append(row)
        self.episode_stats.append(stats)
        self._total_frames += n
        self._frames = []
        return episode

    # -- files ---------------------------------------------------------------------------------
    def _frame_table(self, columns: dict, start: int) -> pa.Table:
        arrays = {}
        for key, feature in self.features.items():
            dtype = feature["dtype"]
            if dtype == "video":
                continue
            if dtype == "image":
                arrays[key] = arrow.image_column([arrow.encode_png(img) for img in columns[key]])
            else:
                arrays[key] = arrow.numeric_column(columns[key], dtype, feature["shape"])
        table = pa.table(arrays)
        return table.replace_schema_metadata({b"huggingface": arrow.hf_features(self.features)})

    def _write_videos(self, columns: dict, n: int) -> dict:
        from loong_embodied.lerobot.video import encode_video

        row = {}
        for key, feature in self.features.items():
            if feature["dtype"] != "video":
                continue
            chunk, file = divmod(self._video_counter, self.chunks_size)
            path = self.root / VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
            feature["info"] = encode_video(np.asarray(columns[key], dtype=np.uint8), path, self.fps)
            row.update({f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": file,
                        f"videos/{key}/from_timestamp": 0.0, f"videos/{key}/to_timestamp": n / self.fps})
        if row:
            self._video_counter += 1
        return row

    def _flush(self) -> None:
        if not self._pending:
            return
        chunk, file = divmod(self._file_counter, self.chunks_size)
        path = self.root / DATA_PATH.format(chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(self._pending), path)
        self._pending = []
        self._file_counter += 1

    def finalize(self) -> Path:
        """Write the remaining frames and every ``meta/`` file; returns the dataset folder."""
        if self._frames:
            raise LeRobotFormatError(f"{len(self._frames)} frames were added after the last save_episode()")
        if not self.episode_rows:
            raise LeRobotFormatError("no episode was saved; nothing to write")
        self._flush()
        meta = self.root / "meta"
        (meta / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(arrow.tasks_table(self.tasks), meta / "tasks.parquet")
        rows = []
        for row, stats in zip(self.episode_rows, self.episode_stats):
            flat = {f"stats/{k}/{name}": np.asarray(v).tolist() for k, per in stats.items() for name, v in per.items()}
            rows.append({**row, **flat, "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        pq.write_table(pa.Table.from_pylist(rows), meta / "episodes" / "chunk-000" / "file-000.parquet")
        stats = aggregate_stats(self.episode_stats)
        (meta / "stats.json").write_text(json.dumps(stats_to_json(stats), indent=4))
        (meta / "info.json").write_text(json.dumps(self._info(), indent=4))
        logger.info("wrote LeRobot %s dataset %s: %d episodes, %d frames, %d tasks", V30, self.root,
                    len(self.episode_rows), self._total_frames, len(self.tasks))
        return self.root

    def _info(self) -> dict:
        has_video = any(f["dtype"] == "video" for f in self.features.values())
        return {
            "codebase_version": V30, "robot_type": self.robot_type,
            "total_episodes": len(self.episode_rows), "total_frames": self._total_frames,
            "total_tasks": len(self.tasks), "chunks_size": self.chunks_size,
            "data_files_size_in_mb": self.max_file_bytes // (1024 * 1024), "video_files_size_in_mb": 200,
            "fps": self.fps, "splits": {"train": f"0:{len(self.episode_rows)}"},
            "data_path": DATA_PATH, "video_path": VIDEO_PATH if has_video else None,
            "features": self.features,
        }
