"""A native reader of LeRobot datasets (v3.0 and v2.1) from a local folder; no LeRobot needed."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from loong_core.errors import ConfigError
from loong_embodied.lerobot.format import read_info
from loong_embodied.lerobot.frames import FrameTable
from loong_embodied.lerobot.meta import read_episodes, read_stats, read_tasks
from loong_embodied.lerobot.normalize import Normalizer
from loong_embodied.lerobot.relative import RelativeActions, current_state, relative_stats
from loong_embodied.lerobot.windows import delta_indices, window_rows

logger = logging.getLogger(__name__)


class LeRobotDataset:
    """Frames of a LeRobot dataset as dicts of numpy arrays, with windows and normalisation.

    Item ``i`` is the ``i``-th frame of the selected episodes. Every feature of ``info.json`` is
    returned under its name: vectors ``[D]``, scalars ``[]``, cameras ``[3, H, W]`` float32 in
    [0, 1] (or ``[H, W, 3]`` uint8 with ``float_images=False``), plus ``task`` (the string).
    A feature named in ``delta_timestamps`` gets a leading time axis ``[T, ...]`` and a bool
    ``<key>_is_pad`` ``[T]`` marking frames beyond the episode's ends (padded with the edge frame).

    Args:
        root: Dataset folder (holds ``meta/`` and ``data/``).
        delta_timestamps: Feature -> offsets in seconds (multiples of ``1 / fps``).
        episodes: ``episode_index`` values to keep (None: all).
        normalization: Feature -> ``mean_std`` / ``min_max`` / ``identity`` (from ``meta/stats.json``).
        float_images: Cameras as ``[3, H, W]`` float32 in [0, 1] (LeRobot's convention) rather
            than the stored ``[H, W, 3]`` uint8.
        video_tolerance_s: Largest gap between a requested and a decoded video timestamp.
        relative: State-relative action dimensions (:mod:`.relative`): each item's action chunk
            holds them as offsets from its current state, normalised with the offsets' statistics
            over the whole dataset (computed here, once).
    """

    def __init__(self, root: str | Path, delta_timestamps: dict[str, list[float]] | None = None,
                 episodes: list[int] | None = None, normalization: dict[str, str] | None = None,
                 float_images: bool = True, video_tolerance_s: float = 1e-4,
                 relative: RelativeActions | None = None):
        self.info = read_info(root)
        self.root = self.info.root
        self.tasks = read_tasks(self.info)
        self.episodes = read_episodes(self.info)
        self.stats = read_stats(self.info)
        self.table = FrameTable(self.info, self.episodes)
        self.float_images = float_images
        self.video_tolerance_s = video_tolerance_s
        self._decoder = None
        unknown = sorted(set(delta_timestamps or {}) - set(self.info.features))
        if unknown:
            raise ConfigError(f"delta_timestamps names {unknown}, which are not features of {self.root}; "
                              f"features: {', '.join(self.info.features)}")
        self.deltas = delta_indices(delta_timestamps, self.info.fps)
        self.relative = relative
        stats = self.stats
        if relative is not None:
            stats = {**stats, relative.action_key: self._relative_stats(relative)}
        self.normalizer = Normalizer(stats, normalization or {})
        self.set_episodes(episodes)
        logger.info("LeRobot %s dataset %s: %d episodes, %d frames, %d tasks, fps %g", self.info.version,
                    self.root, len(self._episode_pos), len(self), len(self.tasks), self.info.fps)

    def set_episodes(self, episodes: list[int] | None) -> None:
        """Keep only the frames of these ``episode_index`` values (None: all)."""
        all_eps = self.episodes.index
        if episodes is None:
            positions = np.arange(len(all_eps))
        else:
            missing = sorted(set(episodes) - set(all_eps.tolist()))
            if missing:
                raise ConfigError(f"episodes {missing} are not in {self.root} "
                                  f"(it has episode_index {all_eps.min()}..{all_eps.max()})")
            positions = np.searchsorted(all_eps, np.asarray(sorted(episodes)))
        self._episode_pos = positions
        self._frames = np.concatenate(
            [np.arange(self.episodes.start[p], self.episodes.stop[p]) for p in positions]
        ) if len(positions) else np.zeros(0, dtype=np.int64)

    @property
    def fps(self) -> float:
        """Frames per second."""
        return self.info.fps

    @property
    def num_episodes(self) -> int:
        """Selected episodes."""
        return len(self._episode_pos)

    def __len__(self) -> int:
        return len(self._frames)

    def episode_frames(self, position: int) -> np.ndarray:
        """Item indices (into this dataset) of the ``position``-th selected episode."""
        offsets = np.concatenate([[0], np.cumsum(self.episodes.length[self._episode_pos])])
        return np.arange(offsets[position], offsets[position + 1])

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(f"frame {i} out of range for a dataset of {len(self)} frames")
        current = int(self._frames[i])
        ep = int(np.searchsorted(self.episodes.start, current, side="right") - 1)
        start, stop = int(self.episodes.start[ep]), int(self.episodes.stop[ep])
        item = {}
        for key in self.info.features:
            if key in self.deltas:
                indices, is_pad = window_rows(start, stop, current, self.deltas[key])
                item[key] = self._gather(key, indices, ep)
                item[f"{key}_is_pad"] = is_pad
            else:
                item[key] = self._gather(key, np.array([current]), ep)[0]
        task_index = int(self.table.columns["task_index"][self.table.row_of(current)])
        item["task"] = self.tasks[task_index]
        if self.relative is not None:
            r = self.relative
            state = current_state(item[r.state_key], self.deltas.get(r.state_key))
            item[r.action_key] = r.to_relative(item[r.action_key], state)
        return self.normalizer(item)

    def _relative_stats(self, relative: RelativeActions) -> dict:
        """Statistics of the state-relative action chunks over every episode of the dataset (as
        ``meta/stats.json`` covers every episode), whatever the selection."""
        for key in (relative.action_key, relative.state_key):
            if key not in self.info.features:
                raise ConfigError(f"state-relative actions read '{key}', which is not a feature of {self.root}")
        current_state(np.zeros((len(self.deltas.get(relative.state_key, [0])), 1)),
                      self.deltas.get(relative.state_key))   # the window holds the current frame
        order = np.argsort(self.episodes.start, kind="stable")
        starts, stops = self.episodes.start[order], self.episodes.stop[order]
        frames = np.concatenate([np.arange(a, b) for a, b in zip(starts, stops)])
        lengths = stops - starts
        rows = self.table.row_of(frames)
        offsets = self.deltas.get(relative.action_key, np.zeros(1, dtype=np.int64))
        # frame index -> position in ``frames`` (sorted): the chunk's frames, clipped to the episode
        first, last = np.repeat(starts, lengths), np.repeat(stops, lengths) - 1
        targets = [np.searchsorted(frames, np.clip(frames + int(k), first, last)) for k in offsets]
        actions = np.asarray(self.table.columns[relative.action_key][rows], dtype=np.float64)
        states = np.asarray(self.table.columns[relative.state_key][rows], dtype=np.float64)
        return relative_stats(actions, states, targets, relative, self.stats.get(relative.action_key, {}))

    def _gather(self, key: str, indices: np.ndarray, ep: int) -> np.ndarray:
        rows = self.table.row_of(indices)
        dtype = self.info.features[key].get("dtype")
        if dtype == "video":
            frames = self._video_frames(key, rows, ep)
        elif dtype == "image":
            frames = np.stack([self.table.image(key, int(r)) for r in rows])
        else:
            return self.table.columns[key][rows]
        if self.float_images:
            return np.ascontiguousarray(frames.transpose(0, 3, 1, 2), dtype=np.float32) / 255.0
        return frames

    def _video_frames(self, key: str, rows: np.ndarray, ep: int) -> np.ndarray:
        from loong_embodied.lerobot.video import VideoDecoder

        if self._decoder is None:
            self._decoder = VideoDecoder(self.video_tolerance_s)
        segment = self.episodes.videos[key][ep]
        path = self.info.video_file(key, segment.chunk_index, segment.file_index, int(self.episodes.index[ep]))
        stamps = [segment.from_timestamp + float(t) for t in self.table.columns["timestamp"][rows]]
        return self._decoder.frames(path, stamps)
