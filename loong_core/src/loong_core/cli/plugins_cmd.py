"""``loong plugins``: what is installed, which hooks each plugin implements, what it registers."""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    """Add the ``plugins`` subcommand."""
    p = subparsers.add_parser("plugins", help="list installed plugins and what they register")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run)


def plugin_records() -> list[dict]:
    """One dict per plugin: name, distribution, version, hooks, registered, error."""
    from loong_core.plugins import get_plugin_system

    system = get_plugin_system()
    registry = system.registry()
    records = [info.as_dict() for info in system.infos]
    for conflict in registry.conflicts:
        for record in records:
            if f"plugin '{record['name']}')" in conflict and record["error"] is None:
                record["error"] = conflict
    return records


def run(args, extra) -> int:
    """Print the plugin table (or JSON)."""
    records = plugin_records()
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    rows = [("PLUGIN", "DISTRIBUTION", "VERSION", "HOOKS", "REGISTERED", "ERROR")]
    for r in records:
        registered = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(r["registered"].items()))
        hooks = ", ".join(h.replace("loong_", "") for h in r["hooks"])
        rows.append((r["name"], r["distribution"], r["version"], hooks, registered, r["error"] or "-"))
    widths = [min(max(len(row[i]) for row in rows), 60) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(len(widths))]
        print("  ".join(cells + [row[-1]]))
    return 0
