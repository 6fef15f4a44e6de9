"""Which of torch's Adam / SGD implementations a run steps with (``optim.implementation``).

torch has three: a Python loop over the parameters (``for-loop``), one ``_foreach`` op per
update term over all of them (``foreach``) and one fused kernel per device and dtype (``fused``).
torch picks ``foreach`` on CUDA and the loop everywhere else; megatron-core without Apex or
TransformerEngine (on CPU, and on GPUs without them) builds plain ``torch.optim.AdamW`` and so gets
the same. ``auto`` takes the fused kernel wherever torch has one for the parameters' device and
dtype (transformers' Trainer does the same by default, ``adamw_torch_fused``, as does torchtitan):
on the default CPU experiment AdamW's step over 7M parameters takes 5.5 ms instead of 23 ms
(``benchmarks/throughput.py``). The updates agree to rounding, not bit for bit (the fused kernel
orders the operations differently), so a run keeps one implementation from start to resume.
Optimizers that are not torch's (Apex / TransformerEngine ``FusedAdam``) are left as they are.
"""

from __future__ import annotations

import logging

import torch

from loong_core.errors import ConfigError

logger = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "fused", "foreach", "for-loop")
_TORCH_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def _fused_devices() -> set[str]:
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    return set(_get_fused_kernels_supported_devices())


def fused_available(device) -> bool:
    """torch has fused optimizer kernels for ``device`` (a ``torch.device`` or its type name)."""
    return torch.device(device).type in _fused_devices()


def planned(implementation: str, device) -> str:
    """What ``implementation`` gives on ``device`` (a device backend), before any optimizer exists:
    ``auto`` is ``fused`` where the backend allows it and torch has the kernel (the rule
    :func:`apply` follows), else ``torch's default``."""
    if implementation != "auto":
        return implementation
    fused = device.fused_optimizers and fused_available(device.torch_device)
    return "fused" if fused else "torch's default"


def _fusable(optimizer: torch.optim.Optimizer) -> bool:
    """Every parameter is a floating-point tensor on a device torch has the fused kernel for."""
    devices = _fused_devices()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return bool(params) and all(p.device.type in devices and torch.is_floating_point(p) for p in params)


def apply(optimizers, implementation: str, auto_fused: bool = True) -> str:
    """Switch torch ``optimizers`` (built with torch's defaults) to ``implementation``.

    Args:
        optimizers: torch optimizers; others (and None) are skipped.
        implementation: One of :data:`IMPLEMENTATIONS`.
        auto_fused: ``auto`` may take the fused kernel (the device backend's
            ``fused_optimizers``).

    Returns:
        What the torch optimizers now run (``fused``, ``foreach``, ``for-loop``, ``default``:
        torch's own choice, or ``mixed``), for the banner.

    Raises:
        ConfigError: ``fused`` where torch has no fused kernel for the parameters.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ConfigError(f"optim.implementation={implementation!r}: choose one of "
                          f"{', '.join(IMPLEMENTATIONS)}.")
    chosen = set()
    for optimizer in optimizers:
        if not isinstance(optimizer, _TORCH_OPTIMIZERS):
            continue
        if not optimizer.param_groups or not any(g["params"] for g in optimizer.param_groups):
            continue
        if implementation == "auto":
            pick = "fused" if auto_fused and _fusable(optimizer) else "default"
        else:
            pick = implementation
        if pick == "fused" and not _fusable(optimizer):
            devices = sorted({p.device.type for g in optimizer.param_groups for p in g["params"]})
            raise ConfigError(f"optim.implementation=fused: torch has no fused {type(optimizer).__name__} "
                              f"for parameters on {', '.join(devices)}; use optim.implementation=auto.")
        flags = {"fused": (True, False), "foreach": (None, True), "for-loop": (None, False),
                 "default": (None, None)}[pick]
        for holder in (optimizer.defaults, *optimizer.param_groups):
            holder["fused"], holder["foreach"] = flags
        if pick == "fused":
            optimizer._step_supports_amp_scaling = True  # as torch's constructor sets for fused
        chosen.add(pick)
    return chosen.pop() if len(chosen) == 1 else ("mixed" if chosen else "default")


def place_step_counts(optimizers) -> None:
    """After a checkpoint load: the fused kernel wants each ``step`` count as an fp32 tensor on
    its parameter's device (what torch's own ``load_state_dict`` does for fused groups; megatron-core's
    distributed optimizer writes the loaded state directly)."""
    for optimizer in optimizers:
        if not isinstance(optimizer, _TORCH_OPTIMIZERS):
            continue
        for group in optimizer.param_groups:
            if not group.get("fused"):
                continue
            for param in group["params"]:
                state = optimizer.state.get(param, {})
                step = state.get("step")
                if torch.is_tensor(step) and (step.device != param.device or step.dtype != torch.float32):
                    state["step"] = step.to(device=param.device, dtype=torch.float32)


def torch_optimizers(megatron_optimizer) -> list:
    """The torch optimizers inside a megatron-core optimizer (chained or single)."""
    chain = getattr(megatron_optimizer, "chained_optimizers", None) or [megatron_optimizer]
    return [getattr(opt, "optimizer", None) for opt in chain]
