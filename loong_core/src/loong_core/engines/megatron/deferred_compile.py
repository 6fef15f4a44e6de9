"""Import megatron-core without paying for ``torch.compile`` at import time.

megatron-core decorates a dozen fused helpers (``fused_bias_geglu``, ``fused_bias_swiglu``, ...)
with ``megatron.core.jit.jit_fuser``, which is ``torch.compile`` on torch >= 2.2. Calling
``torch.compile(fn)`` compiles nothing yet, but it imports dynamo and inductor: about 1.1-1.5 s of
the 2-3 s megatron-core takes to import on a 2-core machine, paid by every rank of every run, and
more at interpreter exit. Every loong process imports megatron-core through
:func:`import_megatron_core` (training: the CPU backend's redirects and the megatron engine;
``loong convert``), under which each decoration returns a wrapper that calls ``torch.compile`` the
first time the helper runs, so a helper that does run behaves as before. Inside a region dynamo is
tracing (``kernels=compile``) the wrapper calls the plain function, which dynamo traces as it
would trace the body of a nested ``torch.compile``.

On a CPU the helpers run as plain torch unless the run compiles its kernels
(:func:`compile_helpers_for_run`): compiling them on the first call imports inductor and builds
C++ code, 4-7 s at the first step of every MoE rank (megatron-core's router decorates
``TopKRouter._apply_expert_bias``), which a short CPU run never recovers. The rule is the
kernel seam's: ``kernels=auto`` compiles on a CPU only for runs long enough to repay it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator

import torch

_compile = {"helpers": True}  # megatron-core's own behaviour until a run decides


def compile_helpers(enabled: bool) -> None:
    """Whether the deferred helpers compile on their first call (``True``, megatron-core's
    behaviour) or run as the plain functions (``False``) in this process from now on; a helper
    already compiled stays compiled."""
    _compile["helpers"] = enabled


def compile_helpers_for_run(device_type: str, backends: dict[str, str]) -> bool:
    """The rule: compile megatron-core's helpers unless the run is on a CPU and none of its
    kernel ops (``op -> resolved backend``) compiles."""
    return device_type != "cpu" or "compile" in backends.values()


def _compile_on_first_call(compile_fn: Callable, fn: Callable | None = None, **options):
    """What ``torch.compile(fn, **options)`` returns, compiled when first called (or ``fn``
    itself while :func:`compile_helpers` is off)."""
    if fn is None:  # used as ``@torch.compile(**options)``
        return lambda f: _compile_on_first_call(compile_fn, f, **options)
    compiled: list[Callable] = []

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():  # dynamo is tracing the caller: it traces fn itself
            return fn(*args, **kwargs)
        if not compiled:
            if not _compile["helpers"]:
                return fn(*args, **kwargs)
            compiled.append(compile_fn(fn, **options))
        return compiled[0](*args, **kwargs)

    return call


@contextlib.contextmanager
def compile_deferred() -> Iterator[None]:
    """Within the block, ``torch.compile(fn)`` wraps ``fn`` instead of setting up dynamo.

    Only for imports in a single thread: ``torch.compile`` is restored on exit.
    """
    real = torch.compile
    torch.compile = functools.partial(_compile_on_first_call, real)
    try:
        yield
    finally:
        torch.compile = real


def import_megatron_core(*modules: str) -> None:
    """Import ``megatron.core`` and ``modules`` (dotted names) with compilation deferred.

    A no-op for a module already imported (then its helpers are whatever they were).

    Args:
        modules: Further modules to import the same way (``megatron.core.dist_checkpointing``,
            loong's engine modules that import megatron-core's models).
    """
    with compile_deferred():
        for name in ("megatron.core", *modules):
            importlib.import_module(name)
