"""State-relative action chunks: chosen action dimensions trained as offsets from the current state.

GR00T N1.6 predicts the arm joints of an action chunk relative to the robot's current joint state
(its per-embodiment "relative" action representation; OpenPI's delta actions are the same idea):
every action of the chunk, on those dimensions, minus the state of the frame the chunk starts at.
The model then learns motions rather than absolute poses, and one chunk reads the same wherever the
arm starts. Dimensions not named (a gripper command, an end-effector delta) stay as recorded.

``data.relative_action_dims`` names the action dimensions, ``data.relative_state_dims`` the state
dimensions they are offsets from (default: the same indices). The normalisation of the action
then needs the statistics of the offsets, not those of ``meta/stats.json``: :func:`relative_stats`
computes them over every frame of the dataset and every step of the chunk (the actions past an
episode's end repeat its last one, as the training windows do). At inference the policy's chunk
is un-normalised with the same statistics and the state is added back (:meth:`to_absolute`).
"""

from __future__ import annotations

import numpy as np

from loong_core.errors import ConfigError


class RelativeActions:
    """Which action dimensions are offsets from which state dimensions.

    Args:
        action_dims: Action dimensions made relative.
        state_dims: The state dimension of each (None: the same indices).
        action_dim: Size of the action vector.
        state_dim: Size of the state vector.
        action_key: The action feature.
        state_key: The state feature.

    Raises:
        ConfigError: Empty, repeated, out-of-range or mismatched dimensions (naming the setting).
    """

    def __init__(self, action_dims: list[int], state_dims: list[int] | None, action_dim: int, state_dim: int,
                 action_key: str = "action", state_key: str = "observation.state"):
        self.action_key, self.state_key = action_key, state_key
        action_dims = [int(d) for d in action_dims]
        state_dims = action_dims if state_dims is None else [int(d) for d in state_dims]
        if not action_dims:
            raise ConfigError("data.relative_action_dims is empty: name the action dimensions to make "
                              "state-relative, or leave it unset (null) for absolute actions")
        if len(state_dims) != len(action_dims):
            raise ConfigError(f"data.relative_state_dims has {len(state_dims)} entries for "
                              f"{len(action_dims)} data.relative_action_dims: give one state dimension per "
                              "action dimension (or leave it unset to use the same indices)")
        for key, dims, size in (("relative_action_dims", action_dims, action_dim),
                                ("relative_state_dims", state_dims, state_dim)):
            bad = [d for d in dims if not 0 <= d < size]
            if bad:
                raise ConfigError(f"data.{key}={dims}: {bad} outside 0..{size - 1} (the "
                                  f"{'action' if key.startswith('relative_action') else 'state'} has {size} "
                                  "dimensions)")
        if len(set(action_dims)) != len(action_dims):
            raise ConfigError(f"data.relative_action_dims={action_dims} repeats a dimension")
        self.action_dims = np.asarray(action_dims, dtype=np.int64)
        self.state_dims = np.asarray(state_dims, dtype=np.int64)

    def to_relative(self, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """``actions [..., A]`` with the named dimensions minus ``state [S]`` (the current frame's)."""
        out = np.array(actions, dtype=np.float32, copy=True)
        out[..., self.action_dims] -= np.asarray(state, dtype=np.float32)[self.state_dims]
        return out

    def to_absolute(self, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`to_relative`: the state added back (a predicted chunk to execute)."""
        out = np.array(actions, dtype=np.float32, copy=True)
        out[..., self.action_dims] += np.asarray(state, dtype=np.float32)[self.state_dims]
        return out


def current_state(state: np.ndarray, offsets: np.ndarray | None) -> np.ndarray:
    """The current frame's state out of a window ``[T, S]`` taken at frame ``offsets`` (None or a
    single frame: ``state`` is ``[S]``).

    Raises:
        ConfigError: The window does not hold the current frame (offset 0).
    """
    if offsets is None:
        return state
    where = np.flatnonzero(np.asarray(offsets) == 0)
    if not len(where):
        raise ConfigError("state-relative actions need the current frame's state: the state window "
                          f"(delta_timestamps) must include offset 0, it has frames {list(offsets)}")
    return state[int(where[0])]


def relative_stats(actions: np.ndarray, states: np.ndarray, targets: list[np.ndarray], relative: RelativeActions,
                   absolute: dict) -> dict[str, np.ndarray]:
    """Statistics of the training target: every frame's action chunk with the named dimensions
    relative to that frame's state.

    Args:
        actions: ``[N, A]`` every frame's action.
        states: ``[N, S]`` every frame's state.
        targets: Per step of the chunk, ``[N]``: the frame whose action is that step of each
            frame's chunk (past the episode's ends its edge frame, as the training windows take).
        relative: The dimensions.
        absolute: ``meta/stats.json``'s statistics of the action (kept for the other dimensions).

    Returns:
        ``{"mean", "std", "min", "max"}`` ``[A]`` (float32; the named dimensions recomputed).
    """
    dims, base = relative.action_dims, states[:, relative.state_dims].astype(np.float64)
    count, total, squares = 0, np.zeros(len(dims)), np.zeros(len(dims))
    low, high = np.full(len(dims), np.inf), np.full(len(dims), -np.inf)
    for t in targets:   # one step of the chunk at a time: memory of one [N, dims] block
        offsets = actions[t][:, dims].astype(np.float64) - base
        count += len(offsets)
        total += offsets.sum(0)
        low, high = np.minimum(low, offsets.min(0)), np.maximum(high, offsets.max(0))
    mean = total / count
    for t in targets:   # second pass for the variance (no cancellation of large sums)
        squares += np.square(actions[t][:, dims].astype(np.float64) - base - mean).sum(0)
    stats = {key: np.array(absolute[key], dtype=np.float64, copy=True) if key in absolute
             else np.zeros(actions.shape[1]) for key in ("mean", "std", "min", "max")}
    for key, value in (("mean", mean), ("std", np.sqrt(squares / count)), ("min", low), ("max", high)):
        stats[key][dims] = value
    return {key: value.astype(np.float32) for key, value in stats.items()}
