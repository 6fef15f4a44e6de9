"""``loong train [overrides] [--nproc-per-node N ...]``."""

from __future__ import annotations

import logging
import signal
import sys

from loong_core.cli.launch_args import add_launch_arguments, launch_options


def add_parser(subparsers) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="train a model (Hydra overrides, e.g. experiment=llama_debug parallel=tp2)",
        description="Compose the config from YAML and overrides, then train. One rank runs in "
                    "this process; more ranks (or nodes) run through torchrun.",
    )
    p.add_argument("overrides", nargs="*", help="Hydra overrides: key=value, group=option")
    add_launch_arguments(p)
    p.set_defaults(func=run, accepts_overrides=True, exit_without_teardown=True)


def run(args, extra) -> int:
    """Validate the config, then launch."""
    from loong_core.config.compose import load_config
    from loong_core.config.validate import check_writable_paths
    from loong_core.devices.select import resolve_device_name
    from loong_core.launch import launch
    from loong_core.runtime import check_layout

    overrides = list(args.overrides) + list(extra)
    options = launch_options(args)
    cfg = load_config(overrides)  # fail before spawning anything
    check_writable_paths(cfg)
    resolve_device_name(cfg.device.name)  # a named device that is missing: one error, here
    if options.nnodes in ("1", "1:1"):
        check_layout(cfg, options.nproc_per_node)
    logging.getLogger("loong.train").info(
        "experiment %s: starting %d rank(s) on this machine (importing torch and the engine, then "
        "data and model)", cfg.name, options.nproc_per_node)
    try:
        launch(options, overrides, cfg)
    except Exception as exc:  # torchrun reports failed workers with ChildFailedError
        if type(exc).__name__ == "SignalException":  # the launcher got SIGTERM/SIGINT; ranks are ended
            sig = int(exc.sigval)
            if sig == signal.SIGTERM and cfg.trainer.save_on_signal:
                print("stopped by SIGTERM after a checkpoint (trainer.save_on_signal); continue with "
                      "trainer.resume=auto", file=sys.stderr)
                return 0
            print(f"stopped by signal {signal.Signals(sig).name}; every rank was ended", file=sys.stderr)
            return 128 + sig
        if type(exc).__name__ != "ChildFailedError":
            raise
        print(f"error: a training rank failed; its log is above.\n{exc}", file=sys.stderr)
        return 1
    return 0
