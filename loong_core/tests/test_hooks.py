"""Every hook is documented in its spec and in docs/hooks.md, and the core uses its own hooks."""

from __future__ import annotations

import inspect
from pathlib import Path

from loong_core import builtin, hookspecs
from loong_core.plugins import get_plugin_system

DOCS = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"


def _hook_names():
    return [n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("loong_")]


def test_every_hookspec_has_a_full_docstring():
    for name in _hook_names():
        doc = inspect.getdoc(getattr(hookspecs, name))
        assert doc and len(doc) > 60, name


def test_every_hook_is_documented_in_docs():
    text = DOCS.read_text()
    for name in _hook_names():
        assert f"`{name}" in text, f"{name} missing from docs/hooks.md"


def test_core_registers_its_builtins_through_the_public_hooks():
    system = get_plugin_system(reload=True)
    core = next(i for i in system.infos if i.name == "core")
    assert core.module == builtin.__name__
    assert set(core.registered["device"]) == {"cpu", "cuda"}
    assert core.registered["engine"] == ["megatron", "torch"]
    assert system.config_search_path()[0] == "pkg://loong_core.conf"


def test_lifecycle_hooks_reach_plugins():
    calls = []

    class Sink:
        @hookspecs.hookimpl
        def loong_on_log_step(self, run, step, metrics):
            calls.append((step, metrics["loss"]))

    system = get_plugin_system(reload=True)
    system.pm.register(Sink())
    system.hook.loong_on_log_step(run=None, step=3, metrics={"loss": 1.5})
    assert calls == [(3, 1.5)]
    get_plugin_system(reload=True)
