"""Testing kit for plugin authors: run ``loong train`` for real and read what it wrote."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def keep_cpu_precision_fp32() -> None:
    """Keep ``parallel.mixed_precision=auto`` at fp32 on CPUs with a bf16 matrix unit too, for this
    process and the runs it starts (``$LOONG_CPU_BF16=0`` unless set): tests compare fp32 numbers,
    whatever CPU runs them. Call it from a ``conftest.py``; export ``LOONG_CPU_BF16=1`` to run a
    suite with auto in bf16."""
    os.environ.setdefault("LOONG_CPU_BF16", "0")


def run_train(overrides: list[str], nproc: int = 1, env: dict | None = None, timeout: float = 600,
              check: bool = True, launch_args: list[str] | None = None,
              cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run ``loong train OVERRIDES --nproc-per-node N`` in a subprocess.

    Args:
        overrides: Hydra overrides.
        nproc: Ranks (torchrun when > 1).
        env: Extra environment variables.
        timeout: Seconds before the run is killed.
        check: Raise ``AssertionError`` with the output when the exit code is not 0.
        launch_args: Further ``loong train`` options (``--nnodes 2 --node-rank 1 ...``).
        cwd: Working directory of the run (None: this process's).
    """
    cmd = [sys.executable, "-m", "loong_core.cli.main", "train", *overrides, "--nproc-per-node", str(nproc),
           *(launch_args or [])]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    # Output goes to files, not pipes: helper processes of a crashed run (data-loader workers,
    # megatron-core's forked checkpoint writers) may outlive it and would hold a pipe open. The
    # run gets its own process group, which is cleaned up afterwards.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=full_env, start_new_session=True, cwd=cwd)
        try:
            returncode = proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(cmd, returncode, out.read(), err.read())
    if check and result.returncode != 0:
        raise AssertionError(
            f"loong train failed ({result.returncode}): {' '.join(cmd)}\n"
            f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
        )
    proc = result
    return proc


_SESSION_CACHES: dict[str, str] = {}


def session_cache(tmp_path_factory) -> str:
    """The prepared-data cache of this test session, one for every package's tests (a corpus is
    prepared once per session, not once per package): ``$LOONG_TEST_CACHE`` when set, else a
    folder in the session's temporary directory, made by the first conftest that asks.

    Args:
        tmp_path_factory: pytest's session-scoped ``tmp_path_factory``.
    """
    if os.environ.get("LOONG_TEST_CACHE"):
        return os.environ["LOONG_TEST_CACHE"]
    session = str(tmp_path_factory.getbasetemp())
    if session not in _SESSION_CACHES:
        _SESSION_CACHES[session] = str(tmp_path_factory.mktemp("loong_cache"))
    return _SESSION_CACHES[session]


def read_metrics(run_dir: str | Path, split: str = "train") -> list[dict]:
    """Records of one split in ``run_dir/metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r["split"] == split]


def losses(run_dir: str | Path, split: str = "train") -> dict[int, float]:
    """``step -> loss`` of one split (needs ``trainer.log_interval=1`` for every step)."""
    return {r["step"]: r["loss"] for r in read_metrics(run_dir, split)}


def assert_within_one_bf16_unit(fp32: dict[int, float], bf16: dict[int, float], steps: int) -> None:
    """A bf16 run's loss curve stays within one bf16 unit (``2^-8`` relative) of the fp32 run's at
    every step, and differs from it somewhere (so the bf16 run really computed in bf16)."""
    assert sorted(bf16) == sorted(fp32) == list(range(1, steps + 1))
    for step in fp32:
        assert abs(bf16[step] - fp32[step]) <= 2.0 ** -8 * abs(fp32[step]), (step, bf16[step], fp32[step])
    assert any(bf16[s] != fp32[s] for s in fp32), "the bf16 run computed in fp32"


#: FP8 loss tolerance: e4m3 keeps 3 mantissa bits, so one rounding is off by up to 2^-4 relative;
#: the loss averages many independent roundings, so a curve stays far closer to the bf16 one. A
#: quarter of one e4m3 rounding step (2^-6, 1.6%) per step is the bound
#: (docs/mixed_precision.md gives the measured values).
FP8_TOLERANCE = 2.0 ** -6


def assert_fp8_close_to_bf16(bf16: dict[int, float], fp8: dict[int, float], steps: int) -> float:
    """An FP8 run's loss curve stays within :data:`FP8_TOLERANCE` (relative) of the bf16 run's
    at every step and differs from it somewhere (so FP8 really ran); returns the largest relative
    difference."""
    assert sorted(fp8) == sorted(bf16) == list(range(1, steps + 1))
    worst = max(abs(fp8[s] - bf16[s]) / abs(bf16[s]) for s in bf16)
    assert worst <= FP8_TOLERANCE, (worst, fp8, bf16)
    assert any(fp8[s] != bf16[s] for s in bf16), "the FP8 run computed in bf16"
    return worst


def assert_balancer_evens_ranks(dataset, cost, balancer, global_batch_size: int = 8, micro_batch_size: int = 2,
                                ranks: int = 2, steps: int = 10) -> None:
    """Check a data balancer on a dataset whose samples differ in cost, in one process.

    For ``steps`` global batches, the ``GlobalBatchLoader`` of every data-parallel rank is asked
    for its micro batches: together they must hold each sample of the global batch exactly once,
    the costs must differ within some global batch (else balancing has nothing to do), and the
    costlier rank's share (``balance/max_over_mean_after``) must never exceed the contiguous
    split's (``..._before``) and be below it on some step.

    Args:
        dataset: Indexable samples (what a data module's ``build`` returns).
        cost: Cost of one sample (the data module's ``sample_cost``).
        balancer: The balancer callable (a registry entry, loaded).
    """
    from loong_core.data.loader import GlobalBatchLoader

    loaders = [GlobalBatchLoader(dataset, global_batch_size, micro_batch_size, rank, ranks, balancer, cost,
                                 collate_fn=lambda samples: [cost(s) for s in samples]) for rank in range(ranks)]
    before, after, spread = [], [], False
    for step in range(steps):
        shares = [c for loader in loaders for micro in loader.micro_batches(step) for c in micro]
        expected = sorted(cost(dataset[i]) for i in loaders[0].global_indices(step))
        assert sorted(shares) == expected, f"step {step}: the ranks' samples are not the global batch's"
        spread = spread or len(set(expected)) > 1
        stats = loaders[0].last_balance_stats.metrics()
        before.append(stats["balance/max_over_mean_before"])
        after.append(stats["balance/max_over_mean_after"])
    assert spread, "every sample costs the same: nothing to balance"
    assert all(a <= b for a, b in zip(after, before)), (before, after)
    assert any(a < b for a, b in zip(after, before)), (before, after)


def install_plugin(site_dir: str | Path, distribution: str, entry_name: str, modules: dict[str, str],
                   version: str = "0.0.1") -> Path:
    """Install a plugin distribution into ``site_dir`` the way pip lays one out.

    Writes the modules and a ``<dist>-<version>.dist-info`` folder (METADATA, entry_points.txt,
    RECORD) so that ``importlib.metadata`` finds a real ``loong`` entry point when ``site_dir``
    is on ``sys.path`` (for example through ``PYTHONPATH``).

    Args:
        site_dir: Target directory (created if needed).
        distribution: Distribution name.
        entry_name: Entry-point name in group ``loong``; its value is the first module.
        modules: ``module name -> source``; dotted names create packages.
        version: Distribution version.
    """
    site = Path(site_dir)
    site.mkdir(parents=True, exist_ok=True)
    written = []
    for name, source in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            package = site.joinpath(*parts[:i])
            package.mkdir(exist_ok=True)
            init = package / "__init__.py"
            if not init.exists():
                init.write_text("")
                written.append(init)
        path = site.joinpath(*parts[:-1], parts[-1] + ".py")
        path.write_text(source)
        written.append(path)
    normalized = distribution.replace("-", "_")
    info = site / f"{normalized}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[loong]\n{entry_name} = {next(iter(modules))}\n")
    records = [*written, info / "METADATA", info / "entry_points.txt"]
    (info / "RECORD").write_text("".join(f"{p.relative_to(site)},,\n" for p in records))
    return site


def free_port() -> int:
    """A TCP port on the loopback interface that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo_workers(script: str, nproc: int = 2, timeout: float = 300) -> list[dict]:
    """Run ``python -c script RANK PORT`` for ``nproc`` ranks on the cpu device (one thread each)
    and return every rank's result: the JSON object its last stdout line holds.

    Raises:
        AssertionError: a rank exited with an error (its stderr tail is the message).
    """
    port = free_port()
    env = {**os.environ, "LOONG_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(rank), str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(nproc)]
    outputs = [p.communicate(timeout=timeout) for p in procs]
    results = []
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def registry_with_test_kernels(backends: dict[str, str]):
    """The installed plugins' registry plus test kernels: ``{"<op>:<backend>": "module:function"}``
    (e.g. a counting wrapper, or a reference under a non-plain name)."""
    from loong_core.plugins import get_plugin_system
    from loong_core.plugins.registry import KINDS, Entry, Registry

    reg = Registry()
    for kind in KINDS:
        for entry in get_plugin_system().registry().entries(kind):
            reg.add(entry)
    for name, target in backends.items():
        reg.add(Entry("kernel", name, target, "test", "test", {}))
    return reg


def assert_loss_curve(got: dict[int, float], ref: dict[int, float], steps: range, label: str,
                      tolerance: float = 2e-5) -> None:
    """``got`` has exactly ``steps`` and each loss is within ``tolerance`` (absolute) of ``ref``;
    prints the largest difference (shown with ``pytest -s``)."""
    assert sorted(got) == list(steps), (label, got)
    print(f"{label}: max |loss - one rank| over steps {steps.start}-{steps.stop - 1} = "
          f"{max(abs(got[s] - ref[s]) for s in steps):.2e}")
    for step in steps:
        assert abs(got[step] - ref[step]) <= tolerance, (label, step, got, ref)


@contextmanager
def megatron_single_rank(seed: int = 1234) -> Iterator[None]:
    """A one-rank gloo group and megatron-core parallel state in this process, with the cpu
    backend's patches applied, for tests that build megatron modules directly.

    Args:
        seed: Seed of megatron's model-parallel RNG tracker.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from loong_core.devices.select import select_device

    select_device("cpu").setup()
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    ps.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    try:
        yield
    finally:
        ps.destroy_model_parallel()
        if created:
            dist.destroy_process_group()


@dataclass
class LargestTensor:
    """What :func:`largest_tensor_seen` recorded.

    Attributes:
        numel: Element count of the largest tensor an op returned (0 before any op ran).
    """

    numel: int = 0


@contextmanager
def largest_tensor_seen() -> Iterator[LargestTensor]:
    """Record the largest tensor any aten op returns inside the block, forward and backward: a
    test that a computation never materializes a tensor of some size (the full logits, an
    ``[sq, sk]`` mask) asserts on ``numel`` afterwards.

    Runs the ops under a ``TorchDispatchMode``, so it sees every op on this thread, including
    the autograd backward of CPU tensors.

    Example:
        >>> with largest_tensor_seen() as seen:
        ...     loss(hidden, weight).sum().backward()
        >>> assert seen.numel < n * vocab

    Yields:
        The record, updated as ops run.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = LargestTensor()

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    seen.numel = max(seen.numel, t.numel())
            return out

    with _Record():
        yield seen
