"""Max/mean rank cost of each data balancer on multimodal length mixes, and its run time.

Mix ``multimodal`` (tokens per sample, text included): 85% one image (256-1024 image tokens), 12%
several images (2-8 of them, ~4k tokens), 3% videos (16k-100k tokens, log-uniform). Mix
``images`` is the same without videos (88% one image, 12% several). Cost per sample is
the training-FLOPs model of a 7B decoder, ``a*L^2 + b*L`` with ``a = 6*layers*hidden``, ``b =
6*params`` (attention equals the rest at ~70k tokens). Each row averages ``--trials`` global
batches (fewer at 1024 ranks) of ``ranks x per-rank`` samples.

Columns: ``bound`` is max(mean, largest sample)/mean; ``bound=n`` also uses equal counts: the
rank holding the largest sample holds n-1 others, at least the n-1 cheapest. Times are the
median milliseconds of one call.

Usage: python benchmarks/dp_balance.py [--mix multimodal images] [--trials N] [--per-rank 4 16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from loong_core.data.balancers import contiguous, greedy, kk_swap, rank_costs
from loong_core.data.cost_model import CostModel

BALANCERS = {"none": contiguous, "greedy": greedy, "kk_swap": kk_swap}
RANKS = (8, 64, 256, 1024)
COST = CostModel.for_transformer(num_params=7e9, num_layers=28, hidden_size=3584)


MIXES = {"multimodal": [0.85, 0.12, 0.03], "images": [0.88, 0.12, 0.0]}


def multimodal_lengths(rng: np.random.Generator, size: int, mix: str = "multimodal") -> np.ndarray:
    """Token lengths of ``size`` samples: one image, several images or a video, by ``MIXES[mix]``."""
    kind = rng.choice(3, size=size, p=MIXES[mix])
    text = rng.integers(32, 512, size)
    one_image = rng.integers(256, 1025, size)
    images = np.array([rng.integers(256, 1025, k).sum() for k in rng.integers(2, 9, size)])
    video = np.exp(rng.uniform(np.log(16_000), np.log(100_000), size)).astype(np.int64)
    return text + np.choose(kind, [one_image, images, video])


def lower_bounds(costs: np.ndarray, num_ranks: int) -> tuple[float, float]:
    """``(max(mean, largest), max(mean, largest + n-1 cheapest))``, both over the mean."""
    mean = costs.sum() / num_ranks
    per_rank = len(costs) // num_ranks
    ascending = np.sort(costs)
    cardinality = ascending[-1] + ascending[: per_rank - 1].sum()
    return max(mean, ascending[-1]) / mean, max(mean, cardinality) / mean


def run(mix: str, num_ranks: int, per_rank: int, trials: int, rng: np.random.Generator) -> dict[str, float]:
    """Mean ratios and median times of every balancer over ``trials`` global batches."""
    ratios: dict[str, list[float]] = {name: [] for name in ["bound", "bound=n", *BALANCERS]}
    times: dict[str, list[float]] = {name: [] for name in BALANCERS}
    for _ in range(trials):
        costs = COST.cost(multimodal_lengths(rng, num_ranks * per_rank, mix))
        mean = costs.sum() / num_ranks
        bound, bound_n = lower_bounds(costs, num_ranks)
        ratios["bound"].append(bound)
        ratios["bound=n"].append(bound_n)
        for name, balance in BALANCERS.items():
            start = time.perf_counter()
            assignment = balance(costs, num_ranks)
            times[name].append(time.perf_counter() - start)
            ratios[name].append(rank_costs(costs, assignment).max() / mean)
    row = {name: statistics.fmean(values) for name, values in ratios.items()}
    row.update({f"ms {name}": 1e3 * statistics.median(values) for name, values in times.items()})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mix", nargs="+", default=list(MIXES), choices=list(MIXES))
    parser.add_argument("--trials", type=int, default=20, help="global batches per row (a quarter at 1024 ranks)")
    parser.add_argument("--per-rank", type=int, nargs="+", default=[4, 16], help="samples per rank")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    header = ["ranks", "per rank", "bound", "bound=n", *BALANCERS, *(f"ms {name}" for name in BALANCERS)]
    for mix in args.mix:
        print(f"\nmix {mix}: max/mean rank cost (mean over global batches; 1.000 = perfect)\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---:|" * len(header))
        for per_rank in args.per_rank:
            for num_ranks in RANKS:
                trials = max(1, args.trials // 4) if num_ranks >= 1024 else args.trials
                row = run(mix, num_ranks, per_rank, trials, rng)
                cells = [str(num_ranks), str(per_rank)]
                cells += [f"{row[name]:.3f}" for name in ["bound", "bound=n", *BALANCERS]]
                cells += [f"{row[f'ms {name}']:.2f}" for name in BALANCERS]
                print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
