"""``loong plot RUN_DIR [RUN_DIR ...] [--out FILE]``: training curves to PNG."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    """Add the ``plot`` subcommand."""
    p = subparsers.add_parser(
        "plot", help="draw loss, learning rate, grad norm and throughput of runs to a PNG",
        description="Read each run's metrics.jsonl and draw train / validation loss, learning "
                    "rate, gradient norm and throughput against step; several runs are overlaid "
                    "with a legend. Needs matplotlib: pip install 'loong-core[plot]'.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories of loong train")
    p.add_argument("--out", default=None,
                   help="output PNG (default: RUN_DIR/curves.png for one run, else ./curves.png)")
    p.set_defaults(func=run)


def run(args, extra) -> int:
    """Write the PNG and print its path."""
    from pathlib import Path

    from loong_core.plotting import plot_runs

    out = args.out or (Path(args.run_dirs[0]) / "curves.png" if len(args.run_dirs) == 1
                       else Path("curves.png"))
    print(f"wrote {plot_runs(args.run_dirs, out)}")
    return 0
