"""Plugin runtime: discovery through entry points, registries of lazily imported names."""

from loong_core.plugins.manager import PluginInfo, PluginSystem, get_plugin_system, get_registry
from loong_core.plugins.registry import KINDS, Entry, Registry, did_you_mean, import_ref

__all__ = [
    "KINDS",
    "Entry",
    "PluginInfo",
    "PluginSystem",
    "Registry",
    "did_you_mean",
    "get_plugin_system",
    "get_registry",
    "import_ref",
]
