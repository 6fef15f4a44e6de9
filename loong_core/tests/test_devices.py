"""Device selection: config, then $LOONG_DEVICE, then the best available backend."""

from __future__ import annotations

import pytest

from loong_core.devices.select import resolve_device_name, select_device
from loong_core.errors import ConfigError, PluginError


def test_auto_picks_cpu_on_a_machine_without_gpus(monkeypatch):
    monkeypatch.delenv("LOONG_DEVICE", raising=False)
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device_name("auto") == expected


def test_environment_variable_is_used_when_config_says_auto(monkeypatch):
    monkeypatch.setenv("LOONG_DEVICE", "cpu")
    assert resolve_device_name("auto") == "cpu"


def test_config_wins_over_environment(monkeypatch):
    monkeypatch.setenv("LOONG_DEVICE", "nonexistent")
    assert resolve_device_name("cpu") == "cpu"


def test_unavailable_device_is_a_clear_error(monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="device 'cuda' is not available"):
        resolve_device_name("cuda")


def test_unknown_device_suggests_a_name():
    with pytest.raises(PluginError, match="Did you mean 'cpu'"):
        resolve_device_name("cpv")


def test_cpu_backend_contract():
    device = select_device("cpu")
    assert device.name == "cpu" and device.dist_backend == "gloo"
    assert str(device.torch_device) == "cpu"
    assert device.peak_flops(None) > 1e8
