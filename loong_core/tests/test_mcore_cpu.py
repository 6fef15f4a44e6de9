"""The cpu backend's megatron-core redirects: each fixes something that is broken without it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loong_core.devices import mcore_cpu

# Replicated-parameter init depends on the model-parallel RNG tracker switching states. Without
# `rng_lazy_call` the state restore is only queued, so a fork does not change the random stream.
TRACKER_SCRIPT = """
import torch
from loong_core.devices import mcore_cpu
mcore_cpu.apply([{patches}])
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
tracker = get_cuda_rng_tracker()
tracker.add("model-parallel-rng", 1234)
torch.manual_seed(0)
default_stream = torch.rand(3)
torch.manual_seed(0)
with tracker.fork():
    forked = torch.rand(3)
print("fork_follows_default_stream" if torch.equal(forked, default_stream) else "fork_is_independent_of_default_stream")
"""


def _tracker(patches):
    code = TRACKER_SCRIPT.format(patches=", ".join(repr(p) for p in patches))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip().splitlines()[-1]


def test_rng_lazy_call_makes_tracker_forks_switch_state():
    base = ["cuda_rng_and_device"]
    assert _tracker(base) == "fork_follows_default_stream"
    assert _tracker(base + ["rng_lazy_call"]) == "fork_is_independent_of_default_stream"


def test_every_patch_is_documented():
    for name, fn in mcore_cpu.PATCHES.items():
        assert fn.__doc__ and len(fn.__doc__) > 20, name


def test_tensor_type_reports_cuda_for_optimizer_dispatch():
    code = ("import torch; from loong_core.devices import mcore_cpu; mcore_cpu.apply(['tensor_type']);"
            "print(torch.zeros(1).type())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "torch.cuda.FloatTensor"


@pytest.mark.parametrize("name", ["cuda_factories"])
def test_cuda_factories_allocate_on_cpu(name):
    code = ("import torch; from loong_core.devices import mcore_cpu; mcore_cpu.apply(['cuda_factories']);"
            "print(torch.zeros(2, device='cuda').device, torch.arange(3, device=0).device)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["cpu", "cpu"]


def test_factories_stay_inside_device_context_managers():
    """After the patches, ``torch.tensor`` under ``with torch.device("meta")`` is still a meta
    tensor (transformers' from_pretrained relies on it; fresh process so torch's cache of
    device constructors is not built yet, as in a real run)."""
    code = (
        "import torch\n"
        "from loong_core.devices import mcore_cpu\n"
        "mcore_cpu.apply()\n"
        "with torch.device('meta'):\n"
        "    devices = {torch.tensor([1.0]).device.type, torch.arange(3).device.type,\n"
        "               torch.zeros(2).device.type}\n"
        "print(sorted(devices))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['meta']"


def test_checkpoint_write_results_stay_in_this_process():
    """Synchronous saves: a thread queue, kept once installed; asynchronous ones: a queue forked
    writers put into through a pipe (never a multiprocessing manager's proxy)."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from loong_core.engines.megatron.async_checkpoint import ResultsQueue, install_results_queue

    saved = filesystem_async._results_queue
    try:
        filesystem_async._results_queue = None
        install_results_queue(asynchronous=False)
        made = filesystem_async._results_queue
        assert isinstance(made, queue.Queue)
        install_results_queue(asynchronous=False)
        assert filesystem_async._results_queue is made  # one queue per process
        install_results_queue(asynchronous=True)
        forked = filesystem_async._results_queue
        assert isinstance(forked, ResultsQueue)
        install_results_queue(asynchronous=False)
        assert filesystem_async._results_queue is forked  # it serves synchronous saves too
    finally:
        filesystem_async._results_queue = saved
