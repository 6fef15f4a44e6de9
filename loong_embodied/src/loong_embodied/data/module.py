"""``data=lerobot``: a LeRobot dataset as the trainer's map-style datasets (dicts of tensors)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np

from loong_core.errors import ConfigError
from loong_embodied.data.config import LeRobotDataConfig

logger = logging.getLogger(__name__)


class FrameSplit:
    """Map-style dataset: item ``i`` is frame ``order[i % len(order)]`` of ``frames`` as tensors.

    Each item also carries ``noise_seed`` (int64, a function of ``seed`` and ``i``): a policy that
    draws its training noise from it sees the same noise for a sample whichever data-parallel
    rank or micro batch the sample lands in, so a DP run follows the one-rank loss curve.

    Args:
        frames: A :class:`loong_embodied.lerobot.dataset.LeRobotDataset`.
        order: Frame indices (a shuffled epoch order, or the frames in order).
        length: Items this split reports.
        keys: Features kept (their ``_is_pad`` masks follow them).
        seed: Seed mixed into ``noise_seed``.
        future: Camera -> whether it has a history window: the last entry of the camera's window
            is its future frame, split off as ``<camera>.future`` (``_is_pad`` alike); a camera
            without history keeps its ``[C, H, W]`` shape.
    """

    def __init__(self, frames, order: np.ndarray, length: int, keys: list[str], seed: int = 0,
                 future: dict[str, bool] | None = None):
        self.frames, self.order, self.length, self.keys = frames, order, length, keys
        self.seed = seed
        self.future = future or {}

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        import torch

        item = self.frames[int(self.order[i % len(self.order)])]
        out = {}
        for key in self.keys:
            for name in (key, f"{key}_is_pad"):
                if name in item:
                    out[name] = torch.from_numpy(np.ascontiguousarray(item[name]))
        for key, history in self.future.items():
            for name, future in ((key, f"{key}.future"), (f"{key}_is_pad", f"{key}.future_is_pad")):
                out[future] = out[name][-1]
                out[name] = out[name][:-1] if history else out[name][0]
        out["task_index"] = torch.tensor(int(item["task_index"]))
        out["noise_seed"] = torch.tensor((self.seed * 1_000_003 + i) % (2**62), dtype=torch.int64)
        out["task"] = item["task"]
        return out


class LeRobotDataModule:
    """Reads the dataset once per rank; splits by episode; shuffles frames per epoch with the seed."""

    def __init__(self, config: LeRobotDataConfig):
        self.config = config
        if not config.path and config.record_metaworld:
            # Resolved here (every rank, before the run's config.yaml is written) so that the run
            # directory names the dataset it trained on (``loong eval rollout`` reads its stats).
            config.path = str(metaworld_cache_path(config))
        if not config.path:
            raise ConfigError("data.path is not set: point it at a LeRobot dataset folder (the one with "
                              "meta/info.json), for example data.path=/data/metaworld_reach; record one "
                              "with `loong data metaworld --tasks reach-v3 --episodes 20 OUT_DIR`, or set "
                              "data.record_metaworld=[reach-v3] to record it on first use.")

    def prepare(self) -> None:
        """Record the Meta-World demonstrations (``record_metaworld``) if the folder is missing,
        or again (with a warning) when it does not match its manifest."""
        from loong_core.data.manifest import check_cache, write_manifest

        c = self.config
        path = Path(os.path.expandvars(os.path.expanduser(c.path)))
        if not c.record_metaworld:
            return
        if (path / "meta" / "info.json").is_file() and check_cache(path, "Meta-World recording"):
            return
        from loong_embodied.sim.record import record_metaworld

        logger.info("recording %d Meta-World episodes per task of %s into %s (first use)", c.record_episodes,
                    ", ".join(c.record_metaworld), path)
        partial = path.with_name(path.name + ".partial")
        if partial.exists():
            shutil.rmtree(partial)
        summary = record_metaworld(partial, list(c.record_metaworld), c.record_episodes, seed=c.record_seed,
                                   camera="corner" if c.record_images or c.record_video else None,
                                   video=c.record_video)
        write_manifest(partial)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, path)
        logger.info("recorded %d episodes, %d frames in %.1fs", summary.episodes, summary.frames, summary.seconds)

    def setup(self) -> None:
        from loong_embodied.lerobot.dataset import LeRobotDataset
        from loong_embodied.lerobot.format import read_info
        from loong_embodied.lerobot.windows import window_delta_timestamps

        c = self.config
        path = os.path.expandvars(os.path.expanduser(c.path))
        info = read_info(path)
        cameras = info.camera_keys if c.image_keys is None else list(c.image_keys)
        for key in [c.state_key, c.action_key, *cameras]:
            if key not in info.features:
                raise ConfigError(f"'{key}' is not a feature of {path}; features: {', '.join(info.features)}")
        deltas = c.delta_timestamps
        if deltas is None:
            deltas = window_delta_timestamps(info.fps, [c.state_key, *cameras], c.n_obs_steps,
                                             c.action_key, c.chunk_size)
        deltas = dict(deltas)
        if c.future_offset < 0 or (c.future_offset and not cameras):
            raise ConfigError(f"data.future_offset={c.future_offset}: needs a camera (data.image_keys) and "
                              "a number of frames >= 0")
        # A camera's future frame rides at the end of its window; FrameSplit splits it off.
        self.future = {key: key in deltas for key in cameras} if c.future_offset else {}
        for key in self.future:
            deltas[key] = [*deltas.get(key, [0.0]), c.future_offset / info.fps]
        self.keys = [c.state_key, c.action_key, *cameras]
        self.cameras = cameras
        relative = None
        if c.relative_action_dims is not None or c.relative_state_dims is not None:
            from loong_embodied.lerobot.relative import RelativeActions

            size = {key: int(np.prod(info.features[key]["shape"])) for key in (c.state_key, c.action_key)}
            relative = RelativeActions(list(c.relative_action_dims or []), c.relative_state_dims,
                                       size[c.action_key], size[c.state_key], c.action_key, c.state_key)
        self.frames = LeRobotDataset(path, delta_timestamps=deltas, episodes=c.episodes,
                                     normalization=dict(c.normalization), relative=relative)
        positions = np.arange(self.frames.num_episodes)
        n_valid = min(c.valid_episodes, len(positions) - 1) if len(positions) > 1 else 0
        split = len(positions) - n_valid
        self.train_frames = np.concatenate([self.frames.episode_frames(p) for p in positions[:split]])
        self.valid_frames = (np.concatenate([self.frames.episode_frames(p) for p in positions[split:]])
                             if n_valid else self.train_frames)

    def model_overrides(self) -> dict:
        info, c = self.frames.info, self.config
        overrides = {
            "state_dim": int(np.prod(info.features[c.state_key]["shape"])),
            "action_dim": int(np.prod(info.features[c.action_key]["shape"])),
            "chunk_size": len(self.frames.deltas.get(c.action_key, [0])),
            "n_obs_steps": len(self.frames.deltas.get(c.state_key, [0])),
            "num_tasks": len(self.frames.tasks),
            "image_keys": list(self.cameras),
            "future_offset": c.future_offset,
        }
        if self.cameras:
            h, w, ch = info.features[self.cameras[0]]["shape"]
            overrides["image_size"] = [int(ch), int(h), int(w)]
        return overrides

    def build(self, num_train_samples: int, num_valid_samples: int, seed: int):
        rng = np.random.default_rng(seed)
        epochs = -(-num_train_samples // len(self.train_frames))
        order = np.concatenate([rng.permutation(self.train_frames) for _ in range(epochs)])
        train = FrameSplit(self.frames, order, num_train_samples, self.keys, seed, self.future)
        valid = FrameSplit(self.frames, self.valid_frames, max(num_valid_samples, 1), self.keys, seed + 1,
                           self.future)
        logger.info("lerobot: %d train / %d validation frames", len(self.train_frames), len(self.valid_frames))
        return train, valid

    def sample_cost(self, sample: dict) -> float:
        return 1.0


def metaworld_cache_path(config: LeRobotDataConfig) -> Path:
    """Cache folder of the demonstrations ``record_metaworld`` records (a function of what is recorded)."""
    from loong_core.config.compose import cache_root

    tasks = "_".join(t.removesuffix("-v3") for t in config.record_metaworld)
    kind = "video" if config.record_video else "image" if config.record_images else "state"
    return (cache_root(config.cache_dir) / "metaworld"
            / f"{tasks}-{config.record_episodes}ep-seed{config.record_seed}-{kind}")
