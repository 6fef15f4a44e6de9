"""Episode tables, tasks and statistics of a LeRobot dataset (format v3.0 and v2.1)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loong_embodied.lerobot.format import LeRobotFormatError, LeRobotInfo
from loong_embodied.lerobot.stats import aggregate_stats


@dataclass
class VideoSegment:
    """Where one episode of one video feature lies: file and time range inside it."""

    chunk_index: int
    file_index: int | None
    from_timestamp: float


@dataclass
class Episodes:
    """One row per episode, in episode-index order.

    Attributes:
        index: ``episode_index`` of each episode.
        length: Frames per episode.
        start: Global ``index`` of each episode's first frame.
        tasks: Task strings of each episode.
        data_files: ``(chunk_index, file_index or None, episode_index)`` of each episode's frames.
        videos: Video key -> one :class:`VideoSegment` per episode.
    """

    index: np.ndarray
    length: np.ndarray
    start: np.ndarray
    tasks: list[list[str]]
    data_files: list[tuple[int, int | None, int]]
    videos: dict[str, list[VideoSegment]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.index)

    @property
    def stop(self) -> np.ndarray:
        """Global ``index`` one past each episode's last frame."""
        return self.start + self.length


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_tasks(info: LeRobotInfo) -> list[str]:
    """Task strings indexed by ``task_index``."""
    meta = info.root / "meta"
    if (meta / "tasks.parquet").is_file():
        table = pq.read_table(meta / "tasks.parquet")
        names = table.column_names
        # LeRobot writes a pandas frame indexed by the task string: the string is the index column.
        strings = [n for n in names if table.schema.field(n).type in (pa.string(), pa.large_string())]
        text_col = "task" if "task" in names else (strings[0] if strings else None)
        if text_col is None or "task_index" not in names:
            raise LeRobotFormatError(f"{meta / 'tasks.parquet'}: expected a task_index and a task "
                                     f"string column, found {names}")
        rows = zip(table.column("task_index").to_pylist(), table.column(text_col).to_pylist())
    elif (meta / "tasks.jsonl").is_file():
        rows = ((r["task_index"], r["task"]) for r in _read_jsonl(meta / "tasks.jsonl"))
    else:
        raise LeRobotFormatError(f"{meta}: neither tasks.parquet (v3.0) nor tasks.jsonl (v2.1) exists")
    by_index = dict(rows)
    return [by_index[i] for i in range(len(by_index))]


def read_episodes(info: LeRobotInfo) -> Episodes:
    """The episode table (v3.0: ``meta/episodes/*/*.parquet``; v2.1: ``meta/episodes.jsonl``)."""
    if info.is_v3:
        return _episodes_v3(info)
    return _episodes_v21(info)


def _episodes_v3(info: LeRobotInfo) -> Episodes:
    files = sorted((info.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise LeRobotFormatError(f"{info.root}/meta/episodes/ holds no chunk-*/file-*.parquet")
    rows: list[dict] = []
    for path in files:
        names = pq.read_schema(path).names
        wanted = [n for n in names if not n.startswith("stats/")]
        rows.extend(pq.read_table(path, columns=wanted).to_pylist())
    rows.sort(key=lambda r: r["episode_index"])
    videos = {
        key: [VideoSegment(int(r[f"videos/{key}/chunk_index"]), int(r[f"videos/{key}/file_index"]),
                           float(r[f"videos/{key}/from_timestamp"])) for r in rows]
        for key in info.video_keys
    }
    return Episodes(
        index=np.array([r["episode_index"] for r in rows], dtype=np.int64),
        length=np.array([r["length"] for r in rows], dtype=np.int64),
        start=np.array([r["dataset_from_index"] for r in rows], dtype=np.int64),
        tasks=[list(r["tasks"]) for r in rows],
        data_files=[(int(r["data/chunk_index"]), int(r["data/file_index"]), int(r["episode_index"]))
                    for r in rows],
        videos=videos)


def _episodes_v21(info: LeRobotInfo) -> Episodes:
    path = info.root / "meta" / "episodes.jsonl"
    if not path.is_file():
        raise LeRobotFormatError(f"{path} does not exist (a v2.1 dataset lists its episodes there)")
    rows = sorted(_read_jsonl(path), key=lambda r: r["episode_index"])
    length = np.array([r["length"] for r in rows], dtype=np.int64)
    index = np.array([r["episode_index"] for r in rows], dtype=np.int64)
    chunks = [int(i) // info.chunks_size for i in index]
    videos = {key: [VideoSegment(c, None, 0.0) for c in chunks] for key in info.video_keys}
    return Episodes(
        index=index, length=length, start=np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64),
        tasks=[list(r.get("tasks", [])) for r in rows],
        data_files=[(c, None, int(i)) for c, i in zip(chunks, index)], videos=videos)


def _as_arrays(stats: dict) -> dict[str, dict[str, np.ndarray]]:
    return {key: {name: np.asarray(value, dtype=np.float64) for name, value in per.items()}
            for key, per in stats.items()}


def read_stats(info: LeRobotInfo) -> dict[str, dict[str, np.ndarray]]:
    """Feature -> ``{"min", "max", "mean", "std", "count", ...}`` as float64 arrays.

    Reads ``meta/stats.json``; a v2.1 dataset without it has its per-episode statistics
    (``meta/episodes_stats.jsonl``) aggregated. Returns ``{}`` when neither exists.
    """
    meta = info.root / "meta"
    if (meta / "stats.json").is_file():
        return _as_arrays(json.loads((meta / "stats.json").read_text()))
    if (meta / "episodes_stats.jsonl").is_file():
        per_episode = [_as_arrays(r["stats"]) for r in _read_jsonl(meta / "episodes_stats.jsonl")]
        return aggregate_stats(per_episode)
    return {}
