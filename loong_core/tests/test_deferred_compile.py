"""loong imports megatron-core without setting up ``torch.compile``, and ``loong train`` /
``loong convert`` end without the interpreter's teardown once they have succeeded (both: seconds
of every run)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from loong_core.cli import main as cli
from loong_core.engines.megatron import deferred_compile
from loong_core.engines.megatron.deferred_compile import _compile_on_first_call, compile_deferred


def test_a_deferred_function_is_compiled_once_on_its_first_call():
    compiled = []

    def fake_compile(fn, **options):
        compiled.append(options)
        return lambda *args: ("compiled", fn(*args))

    def double(x):
        return 2 * x

    wrapped = _compile_on_first_call(fake_compile, double)
    assert compiled == [] and wrapped.__name__ == "double"
    assert wrapped(3) == ("compiled", 6) and wrapped(4) == ("compiled", 8)
    assert compiled == [{}]
    decorated = _compile_on_first_call(fake_compile, dynamic=True)(double)  # @torch.compile(...)
    assert decorated(1) == ("compiled", 2) and compiled == [{}, {"dynamic": True}]


def test_with_helpers_off_a_deferred_function_runs_plain_until_they_are_on_again():
    compiled = []

    def fake_compile(fn, **options):
        compiled.append(options)
        return lambda *args: ("compiled", fn(*args))

    wrapped = _compile_on_first_call(fake_compile, lambda x: 2 * x)
    try:
        deferred_compile.compile_helpers(False)
        assert wrapped(3) == 6 and compiled == []
        deferred_compile.compile_helpers(True)
        assert wrapped(3) == ("compiled", 6) and compiled == [{}]
        deferred_compile.compile_helpers(False)  # compiled once: stays compiled
        assert wrapped(4) == ("compiled", 8) and compiled == [{}]
    finally:
        deferred_compile.compile_helpers(True)


def test_helpers_compile_off_a_cpu_or_when_the_runs_kernels_compile():
    rule = deferred_compile.compile_helpers_for_run
    assert not rule("cpu", {"rms_norm": "analytic", "swiglu": "torch", "attention": "sdpa"})
    assert rule("cpu", {"rms_norm": "analytic", "swiglu": "compile"})  # a long run, or kernels=compile
    assert rule("mps", {"rms_norm": "torch"})


def test_torch_compile_is_restored_after_the_block():
    import torch

    real = torch.compile
    with pytest.raises(RuntimeError), compile_deferred():
        assert torch.compile is not real
        raise RuntimeError
    assert torch.compile is real


def test_megatron_core_imports_without_dynamo_and_its_fused_helpers_still_work():
    script = """
import sys, warnings
warnings.simplefilter("ignore")
from loong_core.engines.megatron.deferred_compile import import_megatron_core
import_megatron_core("megatron.core.dist_checkpointing")
import torch
deferred = "torch._dynamo" not in sys.modules
from megatron.core.fusions.fused_bias_geglu import geglu  # compiled when first called
print(deferred, torch.compile.__module__, geglu.__wrapped__.__name__)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "torch", "geglu"]


def test_a_cpu_run_that_compiles_no_kernel_never_loads_inductor_for_megatron_cores_helpers():
    script = """
import sys, warnings
warnings.simplefilter("ignore")
from loong_core.engines.megatron import deferred_compile
deferred_compile.import_megatron_core()
import torch
from megatron.core.fusions.fused_bias_geglu import geglu
deferred_compile.compile_helpers(False)
y = torch.randn(4, 6)
ok = torch.equal(geglu(y), geglu.__wrapped__(y))  # the plain function's result
print(ok, "torch._inductor" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "False"]


def test_a_command_that_asks_for_it_exits_at_once_after_success(monkeypatch, capsys):
    exits = []

    def fake_exit():
        exits.append(0)
        raise SystemExit(0)

    monkeypatch.setattr(cli.quick_exit, "exit_without_teardown", fake_exit)
    monkeypatch.setattr(cli, "_run", lambda argv: (0, argparse.Namespace(exit_without_teardown=True)))
    with pytest.raises(SystemExit):
        cli.entry()
    assert exits == [0]
    monkeypatch.setattr(cli, "_run", lambda argv: (2, argparse.Namespace(exit_without_teardown=True)))
    with pytest.raises(SystemExit) as failed:  # a failure exits the ordinary way
        cli.entry()
    assert failed.value.code == 2 and exits == [0]
    monkeypatch.setattr(cli, "_run", lambda argv: (0, argparse.Namespace()))
    with pytest.raises(SystemExit) as ordinary:
        cli.entry()
    assert ordinary.value.code == 0 and exits == [0]


def test_a_deferred_function_traced_by_dynamo_runs_plain_and_is_not_compiled():
    import torch

    compiled = []

    def fake_compile(fn, **options):
        compiled.append(options)
        return fn

    wrapped = _compile_on_first_call(fake_compile, lambda x: x * 3)
    traced = torch.compile(lambda x: wrapped(x) + 1, backend="eager", fullgraph=True)
    assert torch.equal(traced(torch.ones(2)), torch.full((2,), 4.0))
    assert compiled == []  # inside the trace: the plain function, no nested compile
    assert torch.equal(wrapped(torch.ones(2)), torch.full((2,), 3.0)) and compiled == [{}]


def test_training_imports_megatron_core_without_dynamo():
    # The CPU backend's redirects are the first import of megatron-core in a training process.
    script = """
import sys, warnings
warnings.simplefilter("ignore")
from loong_core.devices import mcore_cpu
mcore_cpu.apply()
print("megatron.core" in sys.modules, "torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "False"]


def test_loong_train_asks_to_exit_without_teardown():
    args, _ = cli.build_parser().parse_known_args(["train", "experiment=llama_debug"])
    assert args.exit_without_teardown is True
