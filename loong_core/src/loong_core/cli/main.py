"""Entry point of the ``loong`` command: builds the parser from registered subcommands."""

from __future__ import annotations

import argparse
import logging
import sys

from loong_core import __version__, quick_exit
from loong_core.errors import LoongError
from loong_core.logs import quiet_third_party

GROUP_HELP = {"data": "prepare datasets", "eval": "evaluate models",
              "launch": "job files for cluster schedulers (slurm, k8s)"}


def build_parser() -> argparse.ArgumentParser:
    """Parser with one subcommand per registered ``cli_command`` (imported lazily)."""
    from loong_core.plugins import get_plugin_system

    parser = argparse.ArgumentParser(
        prog="loong",
        description="loong: one training framework for LLM, VLM, diffusion and embodied models.",
    )
    parser.add_argument("--version", action="version", version=f"loong {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    owners: dict[str, str] = {}  # top-level command -> distribution that claimed it
    system = get_plugin_system()
    # Shared "group action" commands first: a plain command of the same name is the one skipped.
    entries = sorted(system.registry().entries("cli_command"), key=lambda e: (" " not in e.name, e.name))
    for entry in entries:
        group, _, action = entry.name.partition(" ")
        kind = "group" if action else "command"
        claimed = owners.get(group)
        if claimed is not None and (kind == "command" or not claimed.startswith("group:")):
            logging.getLogger(__name__).warning(
                "'loong %s' from %s clashes with 'loong %s' from %s; skipped. Register actions as "
                "'%s <action>' in both, or disable one with LOONG_DISABLE_PLUGINS=%s",
                entry.name, entry.distribution, group, claimed.split(":", 1)[-1], group, entry.plugin)
            continue
        try:
            add_parser = entry.load()
        except LoongError as exc:
            logging.getLogger(__name__).warning("%s", exc)
            continue
        if not action:
            owners[group] = f"command:{entry.distribution}"
            add_parser(subparsers)
            continue
        # "group action": several plugins add actions under one command (``loong data ...``).
        owners[group] = f"group:{entry.distribution}"
        if group not in groups:
            group_parser = subparsers.add_parser(group, help=GROUP_HELP.get(group, f"{group} actions"))
            groups[group] = group_parser.add_subparsers(dest=f"{group}_command", metavar="ACTION",
                                                        required=True)
        add_parser(groups[group])
    return parser


def _run(argv: list[str] | None) -> tuple[int, argparse.Namespace | None]:
    """Parse and run; ``(exit code, parsed arguments or None)``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
    except LoongError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2, None
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not args.verbose:
        quiet_third_party()
    if not getattr(args, "func", None):
        parser.print_help()
        return 0, args
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args, extra) or 0), args
    except LoongError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2, args
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130, args


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    return _run(argv)[0]


def entry() -> None:
    """The ``loong`` executable: :func:`main`, then the process ends.

    A command that sets ``exit_without_teardown`` (a parser default: ``loong train``,
    ``loong convert``) ends through :func:`loong_core.quick_exit.exit_without_teardown` once it
    has succeeded; a failing command exits the ordinary way.
    """
    code, args = _run(None)
    if code == 0 and getattr(args, "exit_without_teardown", False):
        quick_exit.exit_without_teardown()
    sys.exit(code)


if __name__ == "__main__":
    entry()
