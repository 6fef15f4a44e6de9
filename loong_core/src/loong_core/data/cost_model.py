"""Per-sample compute cost ``a*L^2 + b*L + c`` of a sample of ``L`` tokens, and its fit.

``a`` is attention (quadratic in the sample's length when attention does not cross samples),
``b`` everything per token (matmuls, norms, the vision encoder's per-patch work), ``c`` a fixed
cost per sample. Balancers only compare costs, so the unit does not matter; with measured
coefficients the unit is seconds.

Fitting. The time of a piece of work done sequentially is the sum of its samples' costs, which is
linear in ``(a, b, c)`` with features ``(sum L^2, sum L, count)``; :meth:`CostModel.fit` solves
that least-squares problem with ``a, b, c >= 0`` in relative error (each observation weighted by
``1 / time``), because timing noise grows with the time and a batch with a long video would
otherwise outweigh hundreds of image batches. Pass per-rank compute times (forward-backward
before the gradient reduction) when you have them. When only the synchronised step time is
known, the step lasts as long as its slowest rank: :meth:`CostModel.fit_slowest_rank` fits that
max-of-linear model by alternating between picking each step's slowest rank under the current
coefficients and refitting on those ranks. Constant per-step time (optimizer, all-reduce) shows up
in ``c`` when every observation has the same sample count, as under equal-count balancing; that
is harmless for balancing, where ``c`` cancels out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np


@dataclass(frozen=True)
class CostModel:
    """Cost ``a*L^2 + b*L + c`` of a sample of ``L`` tokens.

    Attributes:
        a: Cost per squared token (attention).
        b: Cost per token.
        c: Cost per sample.
    """

    a: float = 0.0
    b: float = 1.0
    c: float = 0.0

    def cost(self, lengths: Sequence[float] | np.ndarray) -> np.ndarray:
        """Cost of each sample (vectorised over ``lengths``; returns float64 of the same shape)."""
        length = np.asarray(lengths, dtype=np.float64)
        return (self.a * length + self.b) * length + self.c

    def total(self, lengths: Sequence[float]) -> float:
        """Predicted time of running ``lengths`` one after another (the sum of their costs)."""
        return float(self.cost(lengths).sum())

    @classmethod
    def for_transformer(cls, num_params: float, num_layers: int, hidden_size: int) -> CostModel:
        """Training FLOPs of a decoder with causal attention within each sample (``c = 0``).

        Per token ``6 * num_params`` for the matmuls (forward and backward); attention scores and
        values add ``6 * num_layers * hidden_size * L^2`` per sample of ``L`` tokens (forward
        ``4 * hidden_size * L^2`` per layer, halved by the causal mask, times 3 with backward).
        Use it when no measured fit is available.
        """
        return cls(a=6.0 * num_layers * hidden_size, b=6.0 * num_params, c=0.0)

    @classmethod
    def fit(cls, lengths_per_step: Sequence[Sequence[float]], step_times: Sequence[float]) -> CostModel:
        """Least squares in relative error, with ``a, b, c >= 0``, of ``time = sum of costs``.

        Args:
            lengths_per_step: For each observation, the token lengths of the samples that ran
                sequentially in it (one rank's share of a step, or a whole step on one rank).
            step_times: Measured time of each observation.

        Returns:
            The fitted model (in the unit of ``step_times``).

        Raises:
            ValueError: If the two sequences differ in length, there are fewer than 3 or a time is
                not positive.
        """
        _check_observations(len(lengths_per_step), step_times)
        features = np.stack([_features(lengths) for lengths in lengths_per_step])
        return cls(*_fit_relative(features, step_times))

    @classmethod
    def fit_slowest_rank(cls, lengths_per_rank_per_step: Sequence[Sequence[Sequence[float]]],
                         step_times: Sequence[float], iterations: int = 20) -> CostModel:
        """Fit ``step time = max over ranks of the rank's summed cost`` from synchronised steps.

        Starts from the rank with the most tokens in each step, then alternates: fit on the chosen
        ranks, choose each step's slowest rank under that fit, until the choice stops changing.

        Args:
            lengths_per_rank_per_step: ``[step][rank]`` -> token lengths of that rank's samples.
            step_times: Measured time of each step.
            iterations: Most refits.

        Returns:
            The fitted model.

        Raises:
            ValueError: As for :meth:`fit`.
        """
        _check_observations(len(lengths_per_rank_per_step), step_times)
        features = [np.stack([_features(lengths) for lengths in ranks]) for ranks in lengths_per_rank_per_step]
        chosen = [int(np.argmax(f[:, 1])) for f in features]
        theta = [0.0, 0.0, 0.0]
        for _ in range(max(1, iterations)):
            theta = _fit_relative(np.stack([f[r] for f, r in zip(features, chosen)]), step_times)
            slowest = [int(np.argmax(f @ theta)) for f in features]
            if slowest == chosen:
                break
            chosen = slowest
        return cls(*theta)


def _check_observations(num_observations: int, step_times: Sequence[float]) -> None:
    if num_observations != len(step_times):
        raise ValueError(f"{num_observations} observations of lengths but {len(step_times)} times")
    if num_observations < 3:
        raise ValueError(f"fitting 3 coefficients needs at least 3 observations, got {num_observations}")


def _features(lengths: Sequence[float]) -> np.ndarray:
    """``(sum L^2, sum L, count)`` of one observation."""
    length = np.asarray(lengths, dtype=np.float64)
    return np.array([(length * length).sum(), length.sum(), float(length.size)])


def _fit_relative(features: np.ndarray, times: Sequence[float]) -> list[float]:
    """``(a, b, c) >= 0`` minimising ``sum((features @ coef / time - 1)^2)``."""
    t = np.asarray(times, dtype=np.float64)
    if not (t > 0).all():
        raise ValueError(f"step times must be > 0, got {t[t <= 0][0]}")
    return _nonnegative_least_squares(features / t[:, None], np.ones_like(t))


def _nonnegative_least_squares(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Exact NNLS for a few columns: the best unconstrained fit over supports that stay >= 0.

    The NNLS optimum is the plain least-squares fit on its own support, so trying every support
    and keeping the best non-negative one finds it. Columns are scaled to unit norm first, since
    ``sum L^2`` and ``count`` differ by many orders of magnitude.
    """
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    best, best_residual = np.zeros(x.shape[1]), float(y @ y)
    for size in range(1, x.shape[1] + 1):
        for support in combinations(range(x.shape[1]), size):
            coef, *_ = np.linalg.lstsq(xs[:, support], y, rcond=None)
            if (coef < 0).any():
                continue
            residual = float(np.sum((xs[:, support] @ coef - y) ** 2))
            if residual < best_residual:
                best, best_residual = np.zeros(x.shape[1]), residual
                best[list(support)] = coef
    return [float(v) for v in best / scale]
