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
        future_offset: Frames ahead of the current one at which each camera's future frame is
            delivered as ``<camera>.future`` ``[C, H, W]`` with ``<camera>.future_is_pad`` (True
            past the episode's end, where the last frame stands in): the prediction target of a
            world-action model (``model=wam``). 0: no future frame.
        state_key: Proprioceptive state feature.
        action_key: Action feature.
        image_keys: Camera features passed to the model; None: every camera of the dataset,
            ``[]``: none (state-only).
        normalization: Feature -> ``mean_std`` / ``min_max`` / ``identity`` from ``meta/stats.json``.
        relative_action_dims: Action dimensions trained as offsets from the current state (GR00T
            N1.6's state-relative action chunks, e.g. an arm's joints; the gripper stays absolute),
            normalised with the offsets' statistics; ``loong eval rollout`` adds the state back.
            None: absolute actions.
        relative_state_dims: The state dimension each of ``relative_action_dims`` is relative to
            (None: the same indices).
        episodes: ``episode_index`` values to use (None: all).
        valid_episodes: The last this-many selected episodes are held out for validation (0: none,
            validation then reuses the training episodes).
        record_metaworld: Meta-World tasks (``[reach-v3, push-v3]``) whose expert demonstrations
            are recorded into ``path`` when that folder does not exist yet (``loong data
            metaworld`` on first use; needs ``loong-embodied[sim]``). With ``path`` unset the
            dataset goes to ``<cache>/metaworld/<tasks>-<episodes>ep-seed<seed>-<state|image>``.
        record_episodes: Episodes per task to record.
        record_seed: Base seed of the recorded task variations (evaluate on another one).
        record_images: Record camera images too (about 8 frames/s on 2 CPU cores; state only
            records about 200 frames/s).
        record_video: Record camera images stored as mp4 video (PyAV, as LeRobot's hub datasets
            store them) instead of PNG images in the parquet files.
    """

    path: Optional[str] = None
    delta_timestamps: Optional[dict] = None
    n_obs_steps: int = 1
    chunk_size: int = 1
    future_offset: int = 0
    state_key: str = "observation.state"
    action_key: str = "action"
    image_keys: Optional[list[str]] = None
    normalization: dict = field(default_factory=lambda: {"observation.state": "mean_std", "action": "min_max"})
    relative_action_dims: Optional[list[int]] = None
    relative_state_dims: Optional[list[int]] = None
    episodes: Optional[list[int]] = None
    valid_episodes: int = 1
    record_metaworld: Optional[list[str]] = None
    record_episodes: int = 50
    record_seed: int = 0
    record_images: bool = False
    record_video: bool = False
