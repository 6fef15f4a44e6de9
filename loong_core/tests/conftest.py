"""Fixtures for core tests: a toy plugin distribution installed into a temporary site dir."""

from __future__ import annotations

import os
import sys

import pytest

from loong_core.plugins import get_plugin_system
from loong_core.testing import install_plugin, keep_cpu_precision_fp32

keep_cpu_precision_fp32()

TOY_PLUGIN = '''
from loong_core.hookspecs import hookimpl

@hookimpl
def loong_register_models(register):
    register("toy_gpt", "loong_toy.model:ToyProvider", config="loong_toy.config:ToyModelConfig")

@hookimpl
def loong_register_datasets(register):
    register("toy_tokens", "loong_toy.data:ToyData", config="loong_toy.config:ToyDataConfig")

@hookimpl
def loong_config_search_path():
    return "pkg://loong_toy.conf"
'''

TOY_CONFIG = '''
from __future__ import annotations
from dataclasses import dataclass
from typing import Optional
from loong_core.config.schema import DataConfig, ModelConfig

@dataclass
class ToyModelConfig(ModelConfig):
    hidden_size: int = 32
    dropout: Optional[float] = None

@dataclass
class ToyDataConfig(DataConfig):
    vocab: int = 100
'''


@pytest.fixture
def toy_site(tmp_path, monkeypatch):
    """A site dir holding the ``loong-toy`` plugin, on sys.path and PYTHONPATH; plugins reloaded."""
    site = tmp_path / "site"
    install_plugin(site, "loong-toy", "toy", {"loong_toy.plugin": TOY_PLUGIN,
                                               "loong_toy.config": TOY_CONFIG})
    conf = site / "loong_toy" / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "__init__.py").write_text("")
    (conf / "experiment" / "toy.yaml").write_text(
        "# @package _global_\nname: toy\nmodel:\n  name: toy_gpt\ndata:\n  name: toy_tokens\n")
    monkeypatch.syspath_prepend(str(site))
    # Only core and the test plugins: results must not depend on what else is installed.
    monkeypatch.setenv("LOONG_PLUGINS", "toy,broken,dupe,typo")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    for name in [m for m in sys.modules if m.startswith("loong_toy")]:
        del sys.modules[name]
    get_plugin_system(reload=True)
    yield site
    monkeypatch.undo()
    get_plugin_system(reload=True)
