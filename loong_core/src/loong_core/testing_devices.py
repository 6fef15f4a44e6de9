"""Conformance suite of the device contract (``docs/devices.md``), for every backend package.

A backend package runs it against its backend in its own tests::

    import pytest
    from loong_core.testing_devices import CONTRACT, check

    @pytest.mark.parametrize("item", CONTRACT)
    def test_my_backend_meets_the_device_contract(item):
        assert check(item, MyBackend(local_rank=0)) in ("pass", "n/a")

:func:`check` raises ``AssertionError`` naming what is wrong; it returns ``"pass"``, or ``"n/a"``
where the backend legitimately has nothing to offer (no memory counters, no megatron-core
installed). Every check really exercises the device: tensors are created on it, random numbers
drawn, a one-rank process group of its ``dist_backend`` all-reduces a tensor that lives on it.
Checks run in this process and may apply the backend's ``setup()`` (its library adaptations
stay applied, as in a training process).
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Callable

CONTRACT = ("identity", "torch_device", "dist_backend", "visible_devices", "setup",
            "environment_defaults", "synchronize", "rng_round_trip", "memory_stats", "dtypes",
            "peak_flops", "library_adaptations")

MEMORY_KEYS = ("mem_gib", "max_mem_gib", "mem_total_gib")
# Settings that belong to the site, never to a backend's defaults.
_SITE_ONLY = re.compile(r"(SOCKET_IFNAME|IB_HCA|IB_GID|_HOSTS?$|MASTER_ADDR|MASTER_PORT|NET_PLUGIN|"
                        r"RDMA|_IFNAME$|VISIBLE_DEVICES$)")
_USER_VALUE = "set-by-the-user"


def _identity(device) -> str:
    from loong_core.plugins import get_registry

    entry = get_registry().get("device", device.name)
    assert issubclass(type(device), entry.load()), (
        f"backend registered as '{device.name}' is {entry.target}, not {type(device).__name__}")
    text = device.describe()
    assert isinstance(text, str) and text and "\n" not in text, f"describe() must be one line: {text!r}"
    return "pass"


def _torch_device(device) -> str:
    import torch

    dev = device.torch_device
    assert isinstance(dev, torch.device), f"torch_device is {type(dev).__name__}, not torch.device"
    assert device.device_type == dev.type, f"device_type {device.device_type!r} != {dev.type!r}"
    x = torch.ones(3, device=dev)
    assert x.device.type == dev.type, f"a tensor made on {dev} lives on {x.device}"
    assert torch.equal((x + x).cpu(), torch.full((3,), 2.0)), "arithmetic on the device is wrong"
    return "pass"


def _dist_backend(device) -> str:
    import torch
    import torch.distributed as dist

    from loong_core.testing import free_port

    assert device.dist_backend in dist.Backend.backend_list, (
        f"dist_backend {device.dist_backend!r} is none of {dist.Backend.backend_list}")
    if dist.is_initialized():
        group = None
    else:
        kwargs = {"device_id": device.torch_device} if device.torch_device.index is not None else {}
        dist.init_process_group(device.dist_backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1, **kwargs)
        group = True
    try:
        x = torch.full((4,), 3.0, device=device.torch_device)
        dist.all_reduce(x)
        assert x.device.type == device.device_type and torch.equal(x.cpu(), torch.full((4,), 3.0))
    finally:
        if group:
            dist.destroy_process_group()
    return "pass"


def _visible_devices(device) -> str:
    var = device.visible_devices_var
    if var is None:
        assert device.torch_device.index is None, (
            "a backend with one device per process names the variable that selects it")
        return "n/a"
    assert re.fullmatch(r"[A-Z][A-Z0-9_]*_VISIBLE_DEVICES", var), f"not a visible-devices variable: {var}"
    return "pass"


def _with_environment(body: Callable[[], None]) -> None:
    saved = dict(os.environ)
    try:
        body()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _setup(device) -> str:
    defaults = device.environment_defaults()

    def body():
        keys = list(defaults)
        if keys:
            os.environ[keys[0]] = _USER_VALUE
            for key in keys[1:]:
                os.environ.pop(key, None)
        device.setup()
        device.setup()  # twice is harmless
        if keys:
            assert os.environ[keys[0]] == _USER_VALUE, f"setup() overwrote the user's {keys[0]}"
            for key in keys[1:]:
                assert os.environ.get(key) == defaults[key], f"setup() did not default {key}"

    _with_environment(body)
    return "pass"


def _environment_defaults(device) -> str:
    defaults = device.environment_defaults()
    assert isinstance(defaults, dict), "environment_defaults() returns a dict"
    for key, value in defaults.items():
        assert isinstance(key, str) and isinstance(value, str), f"{key!r}={value!r} must be strings"
        assert not _SITE_ONLY.search(key), f"{key} is a site setting; a backend must not default it"
    return "pass" if defaults else "n/a"


def _synchronize(device) -> str:
    import torch

    x = torch.randn(64, 64, device=device.torch_device)
    y = x @ x
    assert device.synchronize() is None
    assert torch.isfinite(y).all()
    return "pass"


def _rng_round_trip(device) -> str:
    import torch

    device.manual_seed(1234)
    host, state = torch.get_rng_state(), device.rng_state()
    assert isinstance(state, dict), "rng_state() returns a dict"
    buffer = io.BytesIO()
    torch.save(state, buffer)  # it goes into checkpoints, read back with weights_only=True
    buffer.seek(0)
    try:
        loaded = torch.load(buffer, weights_only=True)
    except Exception as exc:
        raise AssertionError(f"rng_state() does not load with weights_only=True: {exc}") from None
    first = torch.rand(8, device=device.torch_device).cpu()
    torch.set_rng_state(host)
    device.set_rng_state(loaded)
    again = torch.rand(8, device=device.torch_device).cpu()
    assert torch.equal(first, again), "random numbers after set_rng_state(rng_state()) differ"
    device.manual_seed(1234)
    seeded = torch.rand(8, device=device.torch_device).cpu()
    assert torch.equal(first, seeded), "manual_seed(s) does not reproduce the draws"
    return "pass"


def _memory_stats(device) -> str:
    import torch

    keep = torch.empty(2**20, device=device.torch_device)  # 4 MiB held while measuring
    stats = device.memory_stats()
    del keep
    assert isinstance(stats, dict), "memory_stats() returns a dict"
    unknown = set(stats) - set(MEMORY_KEYS)
    assert not unknown, f"unknown memory keys {sorted(unknown)} (contract: {MEMORY_KEYS})"
    for key, value in stats.items():
        assert isinstance(value, float) and math.isfinite(value) and value >= 0, f"{key}={value!r}"
    if "mem_gib" in stats and "max_mem_gib" in stats:
        assert stats["max_mem_gib"] >= stats["mem_gib"], f"peak below current: {stats}"
    if "mem_total_gib" in stats:
        assert stats["mem_total_gib"] >= max(stats.get("max_mem_gib", 0.0), stats.get("mem_gib", 0.0))
    return "pass" if stats else "n/a"


def _dtypes(device) -> str:
    import torch

    dtypes = tuple(device.supported_dtypes)
    assert torch.float32 in dtypes, "float32 is always supported"
    assert device.default_dtype in dtypes, f"default_dtype {device.default_dtype} is not supported"
    assert isinstance(device.fast_bf16, bool), "fast_bf16 is a bool"
    if device.fast_bf16:
        assert torch.bfloat16 in dtypes, "fast_bf16 without bfloat16 support"
    for dtype in dtypes:
        a = torch.ones(8, 8, device=device.torch_device, dtype=dtype)
        out = a @ a
        assert out.dtype == dtype and float(out[0, 0]) == 8.0, f"matmul in {dtype} is wrong"
    return "pass"


def _peak_flops(device) -> str:
    for dtype in device.supported_dtypes:
        peak = device.peak_flops(dtype)
        assert peak is None or (isinstance(peak, float) and math.isfinite(peak) and peak > 0), (
            f"peak_flops({dtype}) = {peak!r}: a positive float, or None when unknown")
        note = device.peak_flops_note(dtype)
        assert isinstance(note, str) and note and "\n" not in note, f"peak_flops_note({dtype}) = {note!r}"
    return "pass"


def _library_adaptations(device) -> str:
    import dataclasses
    import importlib.util

    overrides = device.megatron_overrides()
    assert isinstance(overrides, dict), "megatron_overrides() returns a dict"
    if not overrides:
        return "n/a"
    if importlib.util.find_spec("megatron") is None:
        return "n/a"
    from megatron.core.transformer import TransformerConfig

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(overrides) - fields)
    assert not unknown, f"megatron_overrides() names no TransformerConfig field: {unknown}"
    return "pass"


_CHECKS = {"identity": _identity, "torch_device": _torch_device, "dist_backend": _dist_backend,
           "visible_devices": _visible_devices, "setup": _setup,
           "environment_defaults": _environment_defaults, "synchronize": _synchronize,
           "rng_round_trip": _rng_round_trip, "memory_stats": _memory_stats, "dtypes": _dtypes,
           "peak_flops": _peak_flops, "library_adaptations": _library_adaptations}


def check(item: str, device) -> str:
    """Check one contract item of a backend instance.

    Args:
        item: One of :data:`CONTRACT`.
        device: A :class:`~loong_core.devices.base.DeviceBackend` instance (``setup`` is run by
            the ``setup`` item; the other items run ``setup`` first if it has not been run).

    Returns:
        ``"pass"`` or ``"n/a"``.

    Raises:
        AssertionError: The backend breaks the contract (the message says how).
    """
    if item != "setup" and not getattr(device, "_loong_conformance_setup", False):
        _with_environment(device.setup)
        device._loong_conformance_setup = True
    return _CHECKS[item](device)


def conformance(device) -> dict[str, str]:
    """Every item of :data:`CONTRACT` -> ``pass`` / ``n/a`` / ``FAIL: <why>``."""
    results = {}
    for item in CONTRACT:
        try:
            results[item] = check(item, device)
        except AssertionError as exc:
            results[item] = f"FAIL: {exc}"
    return results
