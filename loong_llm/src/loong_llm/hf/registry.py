"""Lookup of the HF checkpoint adapters registered through ``loong_register_checkpoint_adapters``."""

from __future__ import annotations


def get_adapter(family: str):
    """An instance of the adapter registered for ``family`` (error lists the families)."""
    from loong_core.plugins import get_plugin_system

    entry = get_plugin_system().registry().get("checkpoint_adapter", family)
    return entry.load()()


def family_names() -> list[str]:
    """Families with a registered HF adapter."""
    from loong_core.plugins import get_plugin_system

    return get_plugin_system().registry().names("checkpoint_adapter")
