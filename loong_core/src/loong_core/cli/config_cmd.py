"""``loong config show [overrides]`` and ``loong config groups``."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    """Add the ``config`` subcommand."""
    p = subparsers.add_parser("config", help="show the composed config or the config groups")
    sub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print the composed, validated config as YAML")
    show.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=llama_tiny")
    show.add_argument("--raw", action="store_true", help="print the YAML before validation")
    show.set_defaults(func=run_show)
    groups = sub.add_parser("groups", help="list options per config group and their package")
    groups.set_defaults(func=run_groups)


def run_show(args, extra) -> int:
    """Print the composed config."""
    import dataclasses

    import yaml

    from loong_core.config.compose import compose_raw, load_config

    overrides = list(args.overrides) + list(extra)
    if args.raw:
        data = compose_raw(overrides)
    else:
        data = dataclasses.asdict(load_config(overrides))
    print(yaml.safe_dump(data, sort_keys=False).rstrip())
    return 0


def run_groups(args, extra) -> int:
    """Print every group's options with the package that provides each."""
    from loong_core.config.compose import GROUPS, list_group_options

    options = list_group_options()
    for group in GROUPS:
        rows = [o for o in options if o.group == group]
        print(f"{group}:")
        for o in rows:
            print(f"  {o.option:<28} ({o.package})")
        if not rows:
            print("  (none)")
    return 0
