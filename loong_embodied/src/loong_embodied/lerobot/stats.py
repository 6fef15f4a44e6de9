"""Feature statistics in LeRobot's layout: min, max, mean, std, count and quantiles.

Vectors (state, action) get per-dimension statistics; images get per-channel statistics of
pixel values scaled to [0, 1], shaped ``[C, 1, 1]`` so they broadcast over ``[C, H, W]``.
Per-episode statistics are combined exactly for min/max/mean/std/count; quantiles of the whole
dataset are the count-weighted mean of the episodes' quantiles (what LeRobot stores too).
"""

from __future__ import annotations

import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
# Images: statistics over at most this many frames of an episode (evenly spaced).
MAX_IMAGE_FRAMES = 64


def feature_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Statistics of one feature over the frames of one episode.

    Args:
        values: ``[N, ...]`` numbers, or ``[N, H, W, C]`` uint8 images.

    Returns:
        ``{"min", "max", "mean", "std", "count", "q01", ..., "q99"}``; images ``[C, 1, 1]``.
    """
    values = np.asarray(values)
    if values.dtype == np.uint8 and values.ndim == 4:
        step = max(1, len(values) // MAX_IMAGE_FRAMES)
        pixels = values[::step].astype(np.float64) / 255.0
        flat = pixels.reshape(-1, pixels.shape[-1])            # [pixels, C]
        out = _stats(flat)
        out = {k: (v.reshape(-1, 1, 1) if k != "count" else v) for k, v in out.items()}
        out["count"] = np.array([len(values)])
        return out
    flat = values.reshape(len(values), -1).astype(np.float64)
    out = _stats(flat)
    out["count"] = np.array([len(values)])
    return out


def _stats(flat: np.ndarray) -> dict[str, np.ndarray]:
    out = {"min": flat.min(0), "max": flat.max(0), "mean": flat.mean(0), "std": flat.std(0)}
    qs = np.quantile(flat, list(QUANTILES.values()), axis=0)
    out.update({name: qs[i] for i, name in enumerate(QUANTILES)})
    return out


def aggregate_stats(per_episode: list[dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    """Combine per-episode statistics into dataset statistics (see the module docstring)."""
    keys = dict.fromkeys(k for stats in per_episode for k in stats)
    out = {}
    for key in keys:
        parts = [s[key] for s in per_episode if key in s]
        counts = np.array([float(np.asarray(p["count"]).reshape(-1)[0]) for p in parts])
        weights = counts / counts.sum()

        def wmean(name, parts=parts, weights=weights):
            return sum(w * np.asarray(p[name], dtype=np.float64) for w, p in zip(weights, parts))

        mean = wmean("mean")
        second = sum(w * (np.asarray(p["std"]) ** 2 + np.asarray(p["mean"]) ** 2) for w, p in zip(weights, parts))
        combined = {
            "min": np.min(np.stack([np.asarray(p["min"]) for p in parts]), axis=0),
            "max": np.max(np.stack([np.asarray(p["max"]) for p in parts]), axis=0),
            "mean": mean,
            "std": np.sqrt(np.maximum(second - mean**2, 0.0)),
            "count": np.array([int(counts.sum())]),
        }
        for name in QUANTILES:
            if all(name in p for p in parts):
                combined[name] = wmean(name)
        out[key] = combined
    return out


def stats_to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    """Nested lists, as ``meta/stats.json`` stores them."""
    return {key: {name: np.asarray(v).tolist() for name, v in per.items()} for key, per in stats.items()}
