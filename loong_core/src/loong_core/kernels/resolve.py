"""Resolve ``kernels.<op>`` (``auto`` or a backend name) to a registered kernel for a device.

A kernel is registered (hook ``loong_register_kernels``) as ``"<op>:<backend>"`` with
``meta['reference']`` (its torch reference) and ``meta['available']`` (a ``"module:attr"``
predicate ``() -> bool``). Optional metadata steers ``auto``:

- ``auto_on``: device types (``"cuda"``, ``"cpu"``, ...) where ``auto`` may pick the backend,
  or ``"*"`` (:data:`ops.ANY_DEVICE`) for every device type; by default ``triton`` on ``cuda``
  only (see :data:`ops.DEFAULT_AUTO_ON`).
- ``auto_priority``: int, the highest available candidate wins (default 100 for ``triton``, 0).
- ``auto_min_steps``: int, ``auto`` picks the backend only for runs of at least that many
  steps (``trainer.train_iters``): a one-time cost per process, such as ``torch.compile``'s,
  must be recovered by the faster steps. Unknown steps (no ``loong train``) never qualify.

``auto`` falls back to the op's plain backend (:data:`ops.PLAIN`: ``torch``; ``sdpa`` for
attention). Name checks need no torch; availability checks import the predicate's module.
"""

from __future__ import annotations

from dataclasses import dataclass

from loong_core.errors import ConfigError, PluginError
from loong_core.kernels.ops import ANY_DEVICE, DEFAULT_AUTO_ON, DEFAULT_AUTO_PRIORITY, OPS, PLAIN
from loong_core.plugins.registry import Entry, Registry, did_you_mean

AUTO = "auto"


@dataclass(frozen=True)
class Choice:
    """The backend resolved for one op.

    Attributes:
        op: Op name.
        requested: What the config asked for (``auto`` or a backend).
        backend: The backend chosen.
        entry: Its registry entry.
    """

    op: str
    requested: str
    backend: str
    entry: Entry


def backends(op: str, registry: Registry) -> dict[str, Entry]:
    """Registered backends of ``op``, ``backend -> entry``, sorted by name."""
    prefix = f"{op}:"
    return {e.name[len(prefix):]: e for e in registry.entries("kernel") if e.name.startswith(prefix)}


_AVAILABLE: dict[str, bool] = {}


def is_available(entry: Entry) -> bool:
    """Whether the entry's availability predicate says it runs here (cached per process).

    A predicate that fails to import counts as unavailable."""
    ref = entry.meta.get("available")
    if not ref:
        return True
    if ref not in _AVAILABLE:
        try:
            _AVAILABLE[ref] = bool(entry.load_meta("available")())
        except Exception:  # a broken predicate or missing dependency: not available
            _AVAILABLE[ref] = False
    return _AVAILABLE[ref]


def _auto_on(backend: str, entry: Entry) -> tuple[str, ...]:
    return tuple(entry.meta.get("auto_on", DEFAULT_AUTO_ON.get(backend, ())))


def _auto_picks_on(backend: str, entry: Entry, device_type: str) -> bool:
    on = _auto_on(backend, entry)
    return device_type in on or ANY_DEVICE in on


def _priority(backend: str, entry: Entry) -> int:
    return int(entry.meta.get("auto_priority", DEFAULT_AUTO_PRIORITY.get(backend, 0)))


def _enough_steps(entry: Entry, train_steps: int | None) -> bool:
    need = entry.meta.get("auto_min_steps")
    return need is None or (train_steps is not None and train_steps >= int(need))


def auto_rules(device_type: str, registry: Registry) -> dict[str, str]:
    """``backend -> rule`` of the backends ``auto`` may pick on ``device_type`` only under a
    condition (``auto_min_steps``), in words for ``loong doctor``."""
    rules = {}
    for entry in registry.entries("kernel"):
        _, _, backend = entry.name.partition(":")
        need = entry.meta.get("auto_min_steps")
        if need is not None and _auto_picks_on(backend, entry, device_type):
            rules[backend] = (f"auto picks {backend} on {device_type} for runs of >= {int(need)} steps "
                              f"(trainer.train_iters), else the plain backend")
    return rules


def check_names(requested: dict[str, str], registry: Registry) -> None:
    """Every requested backend is ``auto`` or registered for its op (no import, no torch).

    Raises:
        ConfigError: naming the key, a did-you-mean and the registered backends.
    """
    for op, name in requested.items():
        if op not in OPS:
            raise ConfigError(f"Unknown kernel op 'kernels.{op}'.{did_you_mean(op, list(OPS))} "
                              f"Ops: {', '.join(OPS)}.")
        known = backends(op, registry)
        if name != AUTO and name not in known:
            choices = [AUTO, *known]
            raise ConfigError(
                f"'kernels.{op}' = {name!r} is not a registered backend of {op}."
                f"{did_you_mean(name, choices)} Choices: {', '.join(choices)} "
                f"(`loong doctor` shows which run on this machine).")


def resolve_op(op: str, requested: str, device_type: str, registry: Registry,
              train_steps: int | None = None) -> Choice:
    """Pick the backend of one op for ``device_type`` (``train_steps``: the run's
    ``trainer.train_iters``, for backends with ``auto_min_steps``).

    Raises:
        ConfigError: the backend is unknown, or not available on this machine (listing the
            available ones).
    """
    try:
        registry.check()
    except PluginError as exc:
        raise ConfigError(str(exc)) from None
    check_names({op: requested}, registry)
    known = backends(op, registry)
    if requested == AUTO:
        candidates = [(b, e) for b, e in known.items()
                      if _auto_picks_on(b, e, device_type) and _enough_steps(e, train_steps)
                      and is_available(e)]
        if candidates:
            backend, entry = max(candidates, key=lambda c: (_priority(*c), c[0]))
            return Choice(op, requested, backend, entry)
        plain = PLAIN[op]
        if plain not in known:
            raise ConfigError(f"kernels.{op}: the plain backend '{op}:{plain}' is not registered "
                              f"(is loong-core's builtin plugin disabled?).")
        return Choice(op, requested, plain, known[plain])
    entry = known[requested]
    if not is_available(entry):
        usable = [b for b, e in known.items() if is_available(e)]
        raise ConfigError(
            f"'kernels.{op}' = {requested!r} is not available on this machine (device "
            f"{device_type}; predicate {entry.meta.get('available')}). Available: "
            f"{', '.join([AUTO, *usable])}. Run `loong doctor` for the full table.")
    return Choice(op, requested, requested, entry)


def resolve_all(requested: dict[str, str], device_type: str, registry: Registry,
                train_steps: int | None = None, keep: dict[str, str] | None = None) -> dict[str, Choice]:
    """Resolve every op of :data:`ops.OPS` (missing ones are ``auto``).

    Args:
        requested: ``op -> auto | backend``.
        device_type: Where the run trains.
        registry: Plugin registry.
        train_steps: The run's ``trainer.train_iters`` (for ``auto_min_steps``).
        keep: ``op -> backend`` a resumed run trained with (its checkpoint's record, same device
            type): an op left at ``auto`` keeps that backend where it is registered and available
            here, whatever ``train_steps`` would pick, so that the continuation runs the same kernels.
    """
    choices = {}
    for op in OPS:
        asked = requested.get(op, AUTO)
        kept = backends(op, registry).get((keep or {}).get(op, ""))
        if asked == AUTO and kept is not None and is_available(kept):
            choices[op] = Choice(op, AUTO, keep[op], kept)
        else:
            choices[op] = resolve_op(op, asked, device_type, registry, train_steps)
    return choices
