"""LeRobot dataset layout: ``meta/info.json``, its path templates and feature descriptions.

A LeRobot dataset is a folder::

    meta/info.json            codebase_version, fps, features, path templates, totals
    meta/stats.json           per-feature min / max / mean / std / count / quantiles
    meta/tasks.parquet        task strings (v3.0; ``meta/tasks.jsonl`` in v2.1)
    meta/episodes/...parquet  one row per episode (v3.0; ``meta/episodes.jsonl`` in v2.1)
    data/...parquet           one row per frame
    videos/...mp4             video features (optional)

This module only reads ``info.json``; :mod:`loong_embodied.lerobot.meta` reads the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

V30 = "v3.0"
V21 = "v2.1"
SUPPORTED_VERSIONS = (V30, V21, "v2.0")

# Columns every LeRobot frame table carries besides the recorded features.
INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


class LeRobotFormatError(ValueError):
    """A LeRobot dataset folder is missing a file or holds a value this reader cannot use."""


@dataclass
class LeRobotInfo:
    """The contents of ``meta/info.json``.

    Attributes:
        root: Dataset folder.
        version: ``codebase_version`` (``v3.0``, ``v2.1`` or ``v2.0``).
        fps: Frames per second of every episode.
        features: Feature name -> ``{"dtype", "shape", "names", ...}`` as LeRobot writes it.
        data_path: Template of the frame parquet files.
        video_path: Template of the mp4 files (None without video features).
        chunks_size: Files (v3) or episodes (v2.1) per chunk folder.
        total_episodes: Episodes in the dataset.
        total_frames: Frames in the dataset.
        robot_type: Free text (``sawyer``, ``so100``...), may be None.
        raw: The whole JSON object.
    """

    root: Path
    version: str
    fps: float
    features: dict
    data_path: str
    video_path: str | None
    chunks_size: int
    total_episodes: int
    total_frames: int
    robot_type: str | None = None
    raw: dict = field(default_factory=dict)

    @property
    def is_v3(self) -> bool:
        """Whether the dataset uses format v3.0 (many episodes per file)."""
        return self.version == V30

    def keys_of(self, *dtypes: str) -> list[str]:
        """Feature names whose ``dtype`` is one of ``dtypes`` (for example ``"image"``)."""
        return [k for k, f in self.features.items() if f.get("dtype") in dtypes]

    @property
    def image_keys(self) -> list[str]:
        """Camera features stored in the parquet files (embedded PNG/JPEG or image files)."""
        return self.keys_of("image")

    @property
    def video_keys(self) -> list[str]:
        """Camera features stored as mp4 files."""
        return self.keys_of("video")

    @property
    def camera_keys(self) -> list[str]:
        """Image and video features."""
        return self.keys_of("image", "video")

    def data_file(self, chunk_index: int, file_index: int | None = None,
                  episode_index: int | None = None) -> Path:
        """Path of a frame parquet file (v3: chunk/file; v2.1: chunk/episode)."""
        if self.is_v3:
            rel = self.data_path.format(chunk_index=chunk_index, file_index=file_index)
        else:
            rel = self.data_path.format(episode_chunk=chunk_index, episode_index=episode_index)
        return self.root / rel

    def video_file(self, key: str, chunk_index: int, file_index: int | None = None,
                   episode_index: int | None = None) -> Path:
        """Path of an mp4 file of video feature ``key``."""
        if not self.video_path:
            raise LeRobotFormatError(f"{self.root}/meta/info.json has no 'video_path' but feature "
                                     f"'{key}' is a video")
        if self.is_v3:
            rel = self.video_path.format(video_key=key, chunk_index=chunk_index, file_index=file_index)
        else:
            rel = self.video_path.format(video_key=key, episode_chunk=chunk_index, episode_index=episode_index)
        return self.root / rel


def read_info(root: str | Path) -> LeRobotInfo:
    """Read and check ``ROOT/meta/info.json``.

    Raises:
        LeRobotFormatError: The file is missing, or its version is not supported.
    """
    root = Path(root).expanduser()
    path = root / "meta" / "info.json"
    if not path.is_file():
        raise LeRobotFormatError(
            f"'{root}' is not a LeRobot dataset: {path} does not exist. Point the path at the "
            "folder that holds meta/ and data/ (record one with `loong data metaworld`).")
    raw = json.loads(path.read_text())
    version = raw.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        raise LeRobotFormatError(
            f"{path}: codebase_version {version!r} is not supported; this reader handles "
            f"{', '.join(SUPPORTED_VERSIONS)}. Convert older datasets with LeRobot's converter.")
    for key in ("fps", "features", "data_path"):
        if key not in raw:
            raise LeRobotFormatError(f"{path}: missing key '{key}'")
    return LeRobotInfo(
        root=root, version=version, fps=float(raw["fps"]), features=raw["features"],
        data_path=raw["data_path"], video_path=raw.get("video_path"),
        chunks_size=int(raw.get("chunks_size", 1000)), total_episodes=int(raw.get("total_episodes", 0)),
        total_frames=int(raw.get("total_frames", 0)), robot_type=raw.get("robot_type"), raw=raw)
