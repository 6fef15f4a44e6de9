"""Dataset configs (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from loong_core.config.schema import DataConfig


@dataclass
class LeRobotDataConfig(DataConfig):
    """A LeRobot-format dataset (v3.0 or v2.1) in a local folder, read by loong's native reader.

    Attributes:
        path: Dataset folder (holds ``meta/info.json``); ``~`` and ``$VARS`` are expanded.
        delta_timestamps: Feature -> offsets in seconds (LeRobot's ``delta_timestamps``). When
            set, ``n_obs_steps`` and ``chunk_size`` are ignored.
        n_obs_steps: Frames of observation history (state and cameras), the current one included.
        chunk_size: Actions per sample (the current one and the following ones): action chunking.
        state_key: Proprioceptive state feature.
        action_key: Action feature.
        image_keys: Camera features passed to the model; None: every camera of the dataset,
            ``[]``: none (state-only).
        normalization: Feature -> ``mean_std`` / ``min_max`` / ``identity`` from ``meta/stats.json``.
        episodes: ``episode_index`` values to use (None: all).
        valid_episodes: The last this-many selected episodes are held out for validation (0: none,
            validation then reuses the training episodes).
    """

    path: Optional[str] = None
    delta_timestamps: Optional[dict] = None
    n_obs_steps: int = 1
    chunk_size: int = 1
    state_key: str = "observation.state"
    action_key: str = "action"
    image_keys: Optional[list[str]] = None
    normalization: dict = field(default_factory=lambda: {"observation.state": "mean_std", "action": "min_max"})
    episodes: Optional[list[int]] = None
    valid_episodes: int = 1
