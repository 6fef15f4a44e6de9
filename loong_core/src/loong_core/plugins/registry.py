"""Registries of names that plugins record, with lazy ``"module:attr"`` references."""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any

from loong_core.errors import PluginError

KINDS = (
    "model",
    "engine",
    "balancer",
    "dataset",
    "device",
    "kernel",
    "checkpoint_adapter",
    "cli_command",
    "default_experiment",
)


def import_ref(ref: str) -> Any:
    """Import ``"module:attr"`` (attr may be dotted) and return the object."""
    if ":" not in ref:
        raise PluginError(f"Bad reference '{ref}': expected 'module:attr'.")
    module_name, attr = ref.split(":", 1)
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def did_you_mean(value: str, choices: list[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


@dataclass
class Entry:
    """One registered name.

    Attributes:
        kind: Registry kind (see ``KINDS``).
        name: The name users write.
        target: ``"module:attr"`` reference, imported by :meth:`load`.
        plugin: Name of the plugin that registered it.
        distribution: Distribution (pip package) of that plugin.
        meta: Extra keyword metadata given at registration.
    """

    kind: str
    name: str
    target: str
    plugin: str
    distribution: str
    meta: dict = field(default_factory=dict)

    def load(self) -> Any:
        """Import and return the target object."""
        try:
            return import_ref(self.target)
        except (ImportError, AttributeError) as exc:
            raise PluginError(
                f"{self.kind} '{self.name}' from {self.distribution} could not be imported "
                f"({self.target}): {exc}. Install the missing package or disable the plugin with "
                f"LOONG_DISABLE_PLUGINS={self.plugin}"
            ) from exc

    def load_meta(self, key: str) -> Any:
        """Import the ``"module:attr"`` stored in ``meta[key]`` (None when absent)."""
        ref = self.meta.get(key)
        return import_ref(ref) if ref else None


class Registry:
    """All registered names, by kind.

    Args:
        broken: Plugins that failed to load, ``name -> (distribution, error)``; named in lookup
            errors so the user learns why a name may be missing.
    """

    def __init__(self, broken: dict[str, tuple[str, str]] | None = None):
        self._entries: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
        self.conflicts: list[str] = []
        self.broken = dict(broken or {})

    def add(self, entry: Entry) -> None:
        """Record an entry; a second registration of the same name is recorded as a conflict."""
        if entry.kind not in self._entries:
            raise PluginError(
                f"Plugin '{entry.plugin}' registered unknown kind '{entry.kind}'. "
                f"Kinds: {', '.join(KINDS)}."
            )
        existing = self._entries[entry.kind].get(entry.name)
        if existing is not None:
            self.conflicts.append(
                f"{entry.kind} '{entry.name}' is registered by two distributions: "
                f"{existing.distribution} (plugin '{existing.plugin}') and {entry.distribution} "
                f"(plugin '{entry.plugin}'). Uninstall one or disable it with "
                f"LOONG_DISABLE_PLUGINS={entry.plugin}"
            )
            return
        self._entries[entry.kind][entry.name] = entry

    def check(self) -> None:
        """Raise :class:`PluginError` if two distributions registered the same name."""
        if self.conflicts:
            raise PluginError("\n".join(self.conflicts))

    def names(self, kind: str) -> list[str]:
        """Sorted names registered in ``kind``."""
        return sorted(self._entries[kind])

    def entries(self, kind: str) -> list[Entry]:
        """Entries of ``kind`` sorted by name."""
        return [self._entries[kind][n] for n in self.names(kind)]

    def has(self, kind: str, name: str) -> bool:
        """Whether ``name`` is registered in ``kind``."""
        return name in self._entries[kind]

    def get(self, kind: str, name: str, key_path: str | None = None) -> Entry:
        """Return the entry, or raise an error listing the choices with a did-you-mean.

        Args:
            kind: Registry kind.
            name: Registered name.
            key_path: Config path that named it (for the error message).
        """
        self.check()
        entry = self._entries[kind].get(name)
        if entry is not None:
            return entry
        choices = self.names(kind)
        where = f" (at '{key_path}')" if key_path else ""
        msg = (
            f"Unknown {kind} '{name}'{where}.{did_you_mean(name, choices)} "
            f"Installed: {', '.join(choices) or 'none'}."
        )
        if self.broken:
            failed = "; ".join(
                f"plugin '{plugin}' ({dist}) failed to load: {err} - fix it or disable it with "
                f"LOONG_DISABLE_PLUGINS={plugin}"
                for plugin, (dist, err) in sorted(self.broken.items())
            )
            msg += f" Note: {failed}."
        raise PluginError(msg)
