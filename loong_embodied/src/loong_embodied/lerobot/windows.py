"""``delta_timestamps`` windows: observation history and action chunks around a frame.

``delta_timestamps = {"observation.state": [-0.1, 0.0], "action": [0.0, 0.1, ...]}`` asks, for
the frame at time ``t``, for the values at ``t + dt``. Offsets are whole frames (``dt * fps`` must
be an integer within a tolerance). Frames outside the episode are padded with the episode's first
or last frame and flagged in ``<key>_is_pad``.
"""

from __future__ import annotations

import numpy as np

from loong_core.errors import ConfigError

TOLERANCE_FRAMES = 1e-3


def delta_indices(delta_timestamps: dict[str, list[float]] | None, fps: float) -> dict[str, np.ndarray]:
    """Frame offsets per key: ``round(dt * fps)``.

    Raises:
        ConfigError: An offset is not a whole number of frames at this ``fps``.
    """
    out = {}
    for key, deltas in (delta_timestamps or {}).items():
        frames = np.asarray(deltas, dtype=np.float64) * fps
        rounded = np.round(frames)
        bad = np.abs(frames - rounded) > TOLERANCE_FRAMES
        if bad.any():
            raise ConfigError(
                f"delta_timestamps['{key}'] = {list(deltas)}: {np.asarray(deltas)[bad].tolist()} are not "
                f"whole frames at {fps} fps; use multiples of 1/fps = {1.0 / fps:.6g}s")
        out[key] = rounded.astype(np.int64)
    return out


def window_delta_timestamps(fps: float, observation_keys: list[str], n_obs_steps: int = 1,
                            action_key: str = "action", chunk_size: int = 1,
                            obs_step: int = 1) -> dict[str, list[float]]:
    """The usual policy windows: ``n_obs_steps`` frames of history and ``chunk_size`` actions.

    Args:
        fps: Dataset frame rate.
        observation_keys: Keys that get the history window (state, cameras).
        n_obs_steps: Frames of history including the current one (1: only the current frame).
        action_key: Key of the action chunk.
        chunk_size: Future actions including the current one.
        obs_step: Frames between history entries.

    Returns:
        ``delta_timestamps`` (keys with a single ``0.0`` offset are left out: no window).
    """
    if n_obs_steps < 1 or chunk_size < 1:
        raise ConfigError(f"n_obs_steps ({n_obs_steps}) and chunk_size ({chunk_size}) must be >= 1")
    out: dict[str, list[float]] = {}
    if n_obs_steps > 1:
        history = [(i - n_obs_steps + 1) * obs_step / fps for i in range(n_obs_steps)]
        out.update({key: history for key in observation_keys})
    if chunk_size > 1:
        out[action_key] = [i / fps for i in range(chunk_size)]
    return out


def window_rows(start: int, stop: int, current: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Global frame indices of a window and its padding mask.

    Args:
        start: Global index of the episode's first frame.
        stop: One past the episode's last frame.
        current: Global index of the frame the window is centred on.
        offsets: Frame offsets (from :func:`delta_indices`).

    Returns:
        ``(indices, is_pad)``: indices clamped into ``[start, stop)``; ``is_pad`` is True where
        the requested frame lies outside the episode.
    """
    wanted = current + offsets
    is_pad = (wanted < start) | (wanted >= stop)
    return np.clip(wanted, start, stop - 1), is_pad
