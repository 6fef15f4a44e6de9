"""``loong plot``: the curves of one or more runs (from their ``metrics.jsonl``) in one PNG.

Panels: train and validation loss, learning rate, gradient norm and throughput against step;
several runs are overlaid in one colour each with a legend. matplotlib is an optional extra
(``pip install 'loong-core[plot]'``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from loong_core.errors import ConfigError, MissingDependencyError

#: Panels: (title, y label, metric keys drawn in it as (split, key, line style)).
PANELS = (
    ("loss", "loss", (("train", "loss", "-"), ("valid", "loss", "--"))),
    ("learning rate", "lr", (("train", "lr", "-"),)),
    ("gradient norm", "grad norm", (("train", "grad_norm", "-"),)),
    ("throughput", "per second", (("train", "*_per_sec", "-"),)),
)


@dataclass
class RunCurves:
    """The series of one run: ``(split, key) -> ([steps], [values])``."""

    label: str
    series: dict[tuple[str, str], tuple[list[int], list[float]]] = field(default_factory=dict)

    def get(self, split: str, key: str) -> tuple[str, list[int], list[float]] | None:
        """``(key, steps, values)`` of a series; ``*_per_sec`` matches the run's throughput unit."""
        if key.startswith("*"):
            key = next((k for s, k in self.series if s == split and k.endswith(key[1:])), key)
        steps, values = self.series.get((split, key), ([], []))
        return (key, steps, values) if steps else None


def read_run(run_dir: str | Path) -> RunCurves:
    """The curves of ``run_dir`` (one point per record; null / non-finite values skipped).

    Raises:
        ConfigError: ``run_dir`` has no ``metrics.jsonl`` (not a run directory).
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no metrics.jsonl: pass run directories "
                          "(runs/<experiment>/<time>) of loong train.")
    run_dir = Path(run_dir).resolve()
    curves = RunCurves(label=f"{run_dir.parent.name}/{run_dir.name}")
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed run
        for key, value in record.items():
            if key in ("step", "split", "time") or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value):
                continue
            steps, values = curves.series.setdefault((record["split"], key), ([], []))
            steps.append(record["step"])
            values.append(value)
    return curves


def draw(runs: list[RunCurves]):
    """A matplotlib figure of ``runs`` (one column of panels; a shared legend)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        raise MissingDependencyError("matplotlib", "loong-core[plot]", "loong plot") from None
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(8, 2.6 * len(PANELS)), sharex=True,
                             constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, ylabel, entries) in zip(axes, PANELS):
        ax.set_title(title, loc="left", fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        for i, run in enumerate(runs):
            for split, key, style in entries:
                found = run.get(split, key)
                if found is None:
                    continue
                name, steps, values = found
                unit = f" ({name.removesuffix('_per_sec')}/s)" if key.startswith("*") else ""
                label = f"{run.label} {split}{unit}" if title == "loss" or unit else run.label
                ax.plot(steps, values, style, color=colors[i % len(colors)], linewidth=1.6,
                        marker="o" if split == "valid" else None, markersize=3, label=label)
        if ax.lines:
            ax.legend(fontsize=7, loc="best")
    axes[-1].set_xlabel("step")
    return fig


def plot_runs(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Write the PNG of ``run_dirs`` to ``out``; returns its path."""
    runs = [read_run(d) for d in run_dirs]
    fig = draw(runs)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    from matplotlib import pyplot as plt

    plt.close(fig)
    return out
