"""Normalisation of features from the dataset statistics (``meta/stats.json``)."""

from __future__ import annotations

import numpy as np

from loong_core.errors import ConfigError

MODES = ("mean_std", "min_max", "identity")
EPS = 1e-8


class Normalizer:
    """Maps features to a normalised range and back.

    ``mean_std``: ``(x - mean) / (std + eps)``. ``min_max``: ``2 (x - min) / (max - min + eps) - 1``
    (into [-1, 1]). ``identity``: unchanged. Statistics broadcast over the trailing dimensions
    (``[D]`` for vectors, ``[C, 1, 1]`` for ``[C, H, W]`` images), so windows ``[T, ...]`` work.

    Args:
        stats: Feature -> ``{"mean", "std", "min", "max", ...}`` arrays.
        modes: Feature -> mode; features not named are left unchanged.

    Raises:
        ConfigError: A mode is unknown, or a feature has no statistics.
    """

    def __init__(self, stats: dict[str, dict[str, np.ndarray]], modes: dict[str, str]):
        self.modes = dict(modes)
        self.params: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for key, mode in self.modes.items():
            if mode not in MODES:
                raise ConfigError(f"normalization['{key}'] = '{mode}' is not one of {', '.join(MODES)}")
            if mode == "identity":
                continue
            if key not in stats:
                raise ConfigError(f"normalization names '{key}' but the dataset has no statistics for it; "
                                  f"features with statistics: {', '.join(sorted(stats))}")
            s = stats[key]
            if mode == "mean_std":
                shift, scale = s["mean"], s["std"] + EPS
            else:
                shift = (s["max"] + s["min"]) / 2.0
                scale = (s["max"] - s["min"] + EPS) / 2.0
            self.params[key] = (np.asarray(shift, dtype=np.float32), np.asarray(scale, dtype=np.float32))

    def normalize(self, key: str, value: np.ndarray) -> np.ndarray:
        """``value`` of feature ``key`` in the normalised space (unchanged if not configured)."""
        if key not in self.params:
            return value
        shift, scale = self.params[key]
        return ((value - shift) / scale).astype(np.float32)

    def unnormalize(self, key: str, value: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`normalize` (for example the actions a policy predicts)."""
        if key not in self.params:
            return value
        shift, scale = self.params[key]
        return (value * scale + shift).astype(np.float32)

    def __call__(self, sample: dict) -> dict:
        """A copy of ``sample`` with every configured feature normalised."""
        return {k: self.normalize(k, v) if k in self.params else v for k, v in sample.items()}
