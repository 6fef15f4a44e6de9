"""``loong doctor``: library versions, the devices seen, and which kernel backends run here.

Versions come from package metadata (nothing is imported for them). The device list asks each
registered device backend whether it is available; the kernel table runs each backend's
availability predicate, which is the only reason torch (or triton) gets imported.
"""

from __future__ import annotations

import json
import platform

PACKAGES = ("loong-core", "torch", "megatron-core", "triton", "transformers", "diffusers")


def add_parser(subparsers) -> None:
    """Add the ``doctor`` subcommand."""
    p = subparsers.add_parser("doctor", help="versions, devices and kernel availability")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def versions() -> dict[str, str]:
    """Installed version of each package of :data:`PACKAGES` (``-`` when absent)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "-"
    return out


def devices(registry) -> list[dict]:
    """Every registered device backend: available or why not."""
    rows = []
    for entry in registry.entries("device"):
        try:
            cls = entry.load()
            ok = bool(cls.is_available())
            reason = "" if ok else cls.unavailable_reason()
        except Exception as exc:  # a backend that fails to import is reported, not fatal
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        rows.append({"name": entry.name, "available": ok, "reason": reason,
                     "distribution": entry.distribution})
    return rows


def kernel_table(registry, device_type: str) -> dict:
    """``{"backends": [...], "ops": {op: {backend: available}}, "auto": {op: backend}}`` for
    ``device_type`` (the device ``device=auto`` picks)."""
    from loong_core.kernels.ops import OPS
    from loong_core.kernels.resolve import auto_rules, backends, is_available, resolve_op

    table, names = {}, []
    for op in OPS:
        table[op] = {b: is_available(e) for b, e in backends(op, registry).items()}
        names += [b for b in table[op] if b not in names]
    auto = {op: resolve_op(op, "auto", device_type, registry).backend for op in OPS}
    rules = [rule for backend, rule in auto_rules(device_type, registry).items()
             if any(table[op].get(backend) for op in OPS)]
    return {"device": device_type, "backends": names, "ops": table, "auto": auto, "auto_rules": rules}


def report() -> dict:
    """Everything ``loong doctor`` prints."""
    from loong_core.devices.select import resolve_device_name
    from loong_core.plugins import get_plugin_system

    registry = get_plugin_system().registry()
    device = resolve_device_name("auto")
    return {"versions": versions(), "devices": devices(registry),
            "kernels": kernel_table(registry, device)}


def run(args, extra) -> int:
    """Print the report (or JSON)."""
    data = report()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print("versions: " + "  ".join(f"{k} {v}" for k, v in data["versions"].items()))
    print("devices:")
    for d in data["devices"]:
        state = "available" if d["available"] else f"not available ({d['reason']})"
        print(f"  {d['name']:<8} {state}  [{d['distribution']}]")
    k = data["kernels"]
    print(f"kernels (yes: runs here, no: registered but unavailable, -: not registered; "
          f"* = what auto picks on {k['device']}):")
    header = ["op"] + k["backends"]
    rows = [header]
    for op, cells in k["ops"].items():
        row = [op]
        for b in k["backends"]:
            cell = "-" if b not in cells else ("yes" if cells[b] else "no")
            row.append(cell + ("*" if k["auto"][op] == b else ""))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)))
    for rule in k["auto_rules"]:
        print(f"  {rule} (* shows a run without steps: no loong train)")
    return 0
