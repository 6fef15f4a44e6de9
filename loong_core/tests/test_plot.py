"""``loong plot``: one PNG whose panels really show each run's curves in its legend colour."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from loong_core.cli.main import main as loong_main
from loong_core.errors import MissingDependencyError


def _write_run(run_dir, loss0: float, unit: str = "tokens", scale: float = 1.0) -> None:
    run_dir.mkdir(parents=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(1, 21):
            f.write(json.dumps({"step": step, "split": "train", "time": 0.0, "loss": loss0 - 0.2 * step,
                                "lr": scale * 1e-3 * step / 20, "grad_norm": scale * (2.0 - 0.05 * step),
                                f"{unit}_per_sec": scale * (100.0 + step)}) + "\n")
            if step % 10 == 0:
                f.write(json.dumps({"step": step, "split": "valid", "time": 0.0,
                                    "loss": loss0 - 0.2 * step + 0.3}) + "\n")
        f.write('{"step": 21, "spl')  # a torn last line is skipped




def test_plot_draws_every_curve_of_every_run_in_its_colour(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib import image
    from matplotlib import pyplot as plt
    from matplotlib.colors import to_rgb

    from loong_core.plotting import draw, read_run

    _write_run(tmp_path / "exp" / "a", loss0=6.0)
    _write_run(tmp_path / "exp" / "b", loss0=9.0, unit="samples", scale=1.5)
    runs = [read_run(tmp_path / "exp" / "a"), read_run(tmp_path / "exp" / "b")]
    fig = draw(runs)
    out = tmp_path / "curves.png"
    fig.savefig(out, dpi=100)
    pixels = image.imread(out)[..., :3]
    height = pixels.shape[0]
    colors = [np.array(to_rgb(c)) for c in plt.rcParams["axes.prop_cycle"].by_key()["color"][:2]]
    scale = (1.0, 1.5)
    checks = {0: lambda s, r: r * 3.0 + 6.0 - 0.2 * s, 1: lambda s, r: scale[r] * 1e-3 * s / 20,
              2: lambda s, r: scale[r] * (2.0 - 0.05 * s), 3: lambda s, r: scale[r] * (100.0 + s)}
    for panel, value in checks.items():
        ax = fig.axes[panel]
        for r, color in enumerate(colors):
            for step in (4, 8, 13, 17):
                x, y = ax.transData.transform((step, value(step, r)))
                patch = pixels[int(height - y) - 2:int(height - y) + 3, int(x) - 2:int(x) + 3]
                distance = np.abs(patch - color).sum(axis=-1).min()
                assert distance < 0.15, (panel, r, step, distance)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["exp/a train", "exp/a valid", "exp/b train", "exp/b valid"]
    units = [t.get_text() for t in fig.axes[3].get_legend().get_texts()]
    assert units == ["exp/a train (tokens/s)", "exp/b train (samples/s)"]
    plt.close(fig)


def test_loong_plot_writes_the_png_into_the_run(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _write_run(tmp_path / "run", loss0=5.0)
    assert loong_main(["plot", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'run' / 'curves.png'}"


def test_plot_without_matplotlib_says_which_extra(monkeypatch, tmp_path):
    from loong_core.plotting import plot_runs

    _write_run(tmp_path / "run", loss0=5.0)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'loong-core\[plot\]'"):
        plot_runs([tmp_path / "run"], tmp_path / "x.png")


def test_plot_of_a_folder_without_metrics_is_one_clear_error(tmp_path, capsys):
    assert loong_main(["plot", str(tmp_path)]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err
