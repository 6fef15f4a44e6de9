"""Lookup of the HF checkpoint adapters registered through ``loong_register_checkpoint_adapters``,
and the one table from a ``config.json``'s ``model_type`` to the family that reads it."""

from __future__ import annotations

from loong_core.errors import ConfigError


def get_adapter(family: str):
    """An instance of the adapter registered for ``family`` (error lists the families)."""
    from loong_core.plugins import get_plugin_system

    entry = get_plugin_system().registry().get("checkpoint_adapter", family)
    return entry.load()()


def family_names() -> list[str]:
    """Families with a registered HF adapter."""
    from loong_core.plugins import get_plugin_system

    return get_plugin_system().registry().names("checkpoint_adapter")


def model_type_table() -> dict[str, str]:
    """``model_type -> family`` over every installed adapter that reads ``config.json`` model
    types (adapters of other kinds, e.g. diffusers pipelines, declare none and are skipped)."""
    from loong_core.plugins import get_plugin_system

    registry = get_plugin_system().registry()
    table: dict[str, str] = {}
    for name in registry.names("checkpoint_adapter"):
        adapter_class = registry.get("checkpoint_adapter", name).load()
        for model_type in getattr(adapter_class, "model_types", ()) or ():
            table.setdefault(model_type, name)
    return table


def family_for_model_type(model_type: str | None, where: str) -> str:
    """The family that reads ``model_type`` (from ``where``, a config.json), or a ConfigError
    naming it and the model types the installed plugins support."""
    table = model_type_table()
    if model_type in table:
        return table[model_type]
    supported = ", ".join(sorted(table)) or "none"
    raise ConfigError(
        f"{where} has model_type {model_type!r}, which no installed plugin supports. Supported "
        f"model types: {supported}. Install the plugin that reads it, or pass --family NAME to "
        "read the checkpoint as another family.")
