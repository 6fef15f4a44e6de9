"""A nested component config is validated against the class its registered name declares."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import pytest

from loong_core.config.compose import _force
from loong_core.config.schema import ModelConfig, component
from loong_core.config.validate import build_dataclass
from loong_core.errors import ConfigError
from loong_core.plugins.registry import Entry, Registry

PARTS = textwrap.dedent('''
    from dataclasses import dataclass
    from loong_core.config.schema import ModelConfig

    @dataclass
    class SmallConfig(ModelConfig):
        width: int = 8

    @dataclass
    class BigConfig(ModelConfig):
        width: int = 64
        depth: int = 2
''')


@dataclass
class ComposedConfig(ModelConfig):
    part: ModelConfig = component("model")


@pytest.fixture
def registry(tmp_path, monkeypatch):
    (tmp_path / "toy_parts.py").write_text(PARTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry()
    for name, cls in (("small", "SmallConfig"), ("big", "BigConfig")):
        reg.add(Entry("model", name, "toy_parts:X", "toy", "toy-dist", {"config": f"toy_parts:{cls}"}))
    return reg


def test_component_class_follows_its_name(registry):
    small = build_dataclass(ComposedConfig, {"part": {"name": "small", "width": 4}}, "model", registry)
    big = build_dataclass(ComposedConfig, {"part": {"name": "big", "depth": 3}}, "model", registry)
    assert type(small.part).__name__ == "SmallConfig" and small.part.width == 4
    assert type(big.part).__name__ == "BigConfig" and (big.part.width, big.part.depth) == (64, 3)


def test_component_errors_name_the_nested_path(registry):
    with pytest.raises(ConfigError, match=r"Unknown key 'model.part.depth' for SmallConfig"):
        build_dataclass(ComposedConfig, {"part": {"name": "small", "depth": 3}}, "model", registry)
    with pytest.raises(ConfigError, match=r"Unknown model 'smal' \(at 'model.part.name'\).*Did you mean 'small'"):
        build_dataclass(ComposedConfig, {"part": {"name": "smal"}}, "model", registry)
    with pytest.raises(ConfigError, match=r"'model.part.name' is not set"):
        build_dataclass(ComposedConfig, {"part": {}}, "model", registry)


def test_group_choices_with_a_package_are_not_forced_as_keys():
    assert _force("model@model.foundation=qwen3_debug") == "model@model.foundation=qwen3_debug"
    assert _force("model/projector=merger2x2") == "model/projector=merger2x2"
    assert _force("model.hidden_size=8") == "++model.hidden_size=8"
