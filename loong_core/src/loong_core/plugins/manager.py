"""Plugin discovery (entry points in group ``loong``), loading and the registries they fill."""

from __future__ import annotations

import importlib
import logging
import os
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from loong_core import hookspecs
from loong_core.errors import PluginError
from loong_core.plugins.registry import Entry, Registry

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "loong"
CORE_PLUGIN = "core"

# Registration hook name -> registry kind.
REGISTRATION_HOOKS = {
    "loong_register_models": "model",
    "loong_register_engines": "engine",
    "loong_register_balancers": "balancer",
    "loong_register_datasets": "dataset",
    "loong_register_devices": "device",
    "loong_register_kernels": "kernel",
    "loong_register_checkpoint_adapters": "checkpoint_adapter",
    "loong_register_cli_commands": "cli_command",
    "loong_register_default_experiments": "default_experiment",
}


@dataclass
class PluginInfo:
    """What ``loong plugins`` reports about one plugin.

    Attributes:
        name: Entry-point name (what ``LOONG_PLUGINS`` / ``LOONG_DISABLE_PLUGINS`` use).
        distribution: Distribution that provides it.
        version: Its version.
        module: The plugin module.
        hooks: Hook names the plugin implements.
        registered: Names registered, by kind.
        error: Why the plugin failed to load, or None.
    """

    name: str
    distribution: str
    version: str
    module: str
    hooks: list[str] = field(default_factory=list)
    registered: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None

    def as_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "hooks": self.hooks,
            "registered": self.registered,
            "error": self.error,
        }


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return None
    return {item.strip() for item in raw.split(",") if item.strip()}


class _Register:
    """The ``register`` callable handed to one plugin's registration hook."""

    def __init__(self, kind: str, info: PluginInfo, sink: list[Entry]):
        self.kind, self.info, self.sink = kind, info, sink

    def __call__(self, name: str, target: str = "", **meta: Any) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"Plugin '{self.info.name}' registered a {self.kind} without a name.")
        if target and (not isinstance(target, str) or ":" not in target):
            raise PluginError(
                f"Plugin '{self.info.name}' registered {self.kind} '{name}' with target "
                f"{target!r}; targets are lazy 'module:attr' strings."
            )
        self.sink.append(Entry(self.kind, name, target, self.info.name, self.info.distribution, meta))
        self.info.registered.setdefault(self.kind, []).append(name)


class PluginSystem:
    """Loads plugins once and exposes the hook relay, plugin infos and registries."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.infos: list[PluginInfo] = []
        self._entries: list[Entry] = []
        self._registry: Registry | None = None
        self._load_all()

    # -- loading ---------------------------------------------------------------------------
    def _load_all(self) -> None:
        from loong_core import __version__, builtin

        allow = _env_list("LOONG_PLUGINS")
        deny = _env_list("LOONG_DISABLE_PLUGINS") or set()
        self._add_module(builtin, PluginInfo(CORE_PLUGIN, "loong-core", __version__, builtin.__name__))
        seen: set[str] = set()
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist is not None else "unknown"
            version = ep.dist.version if ep.dist is not None else "unknown"
            if ep.name in seen or ep.name == CORE_PLUGIN:
                continue
            seen.add(ep.name)
            if ep.name in deny or dist in deny:
                continue
            if allow is not None and ep.name not in allow and dist not in allow:
                continue
            info = PluginInfo(ep.name, dist, version, ep.value)
            try:
                module = importlib.import_module(ep.value)
            except Exception as exc:  # a broken plugin must not break loong
                info.error = f"{type(exc).__name__}: {exc}"
                logger.debug("plugin %s failed:\n%s", ep.name, traceback.format_exc())
                self.infos.append(info)
                continue
            self._add_module(module, info)

    def _add_module(self, module: Any, info: PluginInfo) -> None:
        try:
            self.pm.register(module, name=info.name)
            info.hooks = sorted(
                impl_name
                for impl_name in dir(module)
                if impl_name.startswith("loong_") and callable(getattr(module, impl_name))
                and hasattr(getattr(module, impl_name), "loong_impl")
            )
            self.pm.check_pending()
        except Exception as exc:
            if self.pm.is_registered(module):
                self.pm.unregister(module)
            info.error = f"{type(exc).__name__}: {exc}"
            self.infos.append(info)
            return
        entries: list[Entry] = []
        try:
            for hook_name, kind in REGISTRATION_HOOKS.items():
                for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                    if impl.plugin is module:
                        impl.function(_Register(kind, info, entries))
        except Exception as exc:
            self.pm.unregister(module)
            info.error = f"{type(exc).__name__} while registering: {exc}"
            info.registered = {}
            self.infos.append(info)
            return
        self._entries.extend(entries)
        self.infos.append(info)

    # -- queries ---------------------------------------------------------------------------
    @property
    def hook(self) -> Any:
        """The pluggy hook relay (``system.hook.loong_on_log_step(...)``)."""
        return self.pm.hook

    @property
    def broken(self) -> dict[str, tuple[str, str]]:
        """Plugins that failed to load: ``name -> (distribution, error)``."""
        return {i.name: (i.distribution, i.error) for i in self.infos if i.error}

    def registry(self) -> Registry:
        """All registered names; conflicts are raised by lookups (``Registry.get/check``)."""
        if self._registry is None:
            registry = Registry(self.broken)
            for entry in self._entries:
                registry.add(entry)
            self._registry = registry
        return self._registry

    def config_search_path(self) -> list[str]:
        """Config folders of core and every loaded plugin, core first."""
        paths: list[str] = []
        for result in reversed(self.pm.hook.loong_config_search_path()):
            items = [result] if isinstance(result, str) else list(result or [])
            paths.extend(p for p in items if p not in paths)
        return paths

    def require_healthy(self, plugin: str) -> None:
        """Raise if ``plugin`` failed to load, naming the way to disable it."""
        if plugin in self.broken:
            dist, err = self.broken[plugin]
            raise PluginError(
                f"Plugin '{plugin}' ({dist}) failed to load: {err}. Fix its installation, or "
                f"disable it with LOONG_DISABLE_PLUGINS={plugin}"
            )


_SYSTEM: PluginSystem | None = None


def get_plugin_system(reload: bool = False) -> PluginSystem:
    """Return the process-wide plugin system, loading plugins on first use."""
    global _SYSTEM
    if _SYSTEM is None or reload:
        _SYSTEM = PluginSystem()
    return _SYSTEM


def get_registry() -> Registry:
    """Shortcut for ``get_plugin_system().registry()``."""
    return get_plugin_system().registry()
