"""Kernel benchmark: time, bytes moved and peak memory per op and backend, and the fused linear
cross entropy's memory against the unfused loss.

    python benchmarks/kernels.py                     # CPU: torch, compile, chunked
    python benchmarks/kernels.py --device cuda       # adds triton
    python benchmarks/kernels.py --quick             # small shapes, a smoke run
    python benchmarks/kernels.py --ops rms_norm,rope --skip-linear-ce

Every number is for one forward + backward of the op (the output times a fixed random cotangent,
summed, then backward), the median of ``--reps`` repetitions with the backends interleaved (so a
busy machine slows every arm alike). Columns:

- ``ms``: wall time of forward + backward.
- ``MB moved``: the least traffic an implementation can have: inputs read twice (forward and
  backward), outputs written once and their gradient read once, input gradients written once.
  ``GB/s`` is that over ``ms``.
- ``peak MiB``: memory the step adds on top of its inputs at its highest point (CUDA: allocator
  peak; CPU: the process's resident-set high-water mark, reset before the step, with glibc told to
  return every block of 64 KiB and more to the system so that freed memory is not reused unseen).

The linear cross entropy section measures 4k tokens x 128k vocab x hidden 1k (fp32) with the
unfused reference (``hidden @ weight.T`` then cross entropy) against the tiled backends and prints
the ratio of their peak extra memory (the goal: at most 1/4). The table after the main one says, per
op, whether ``compile`` beats ``torch`` here, which is what ``kernels.<op>=auto`` may use on CPU.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# (op, backend) that always run; triton joins on CUDA, chunked is linear_cross_entropy's.
BACKENDS = ("torch", "compile", "triton", "chunked")


@dataclass
class Case:
    """One op at one shape: how to make its inputs and what its arguments are."""

    op: str
    shape: str
    make: Callable[[torch.device, torch.dtype], tuple[list[torch.Tensor], dict]]


def _cases(quick: bool) -> list[Case]:
    """Shapes of a ~1B-parameter model's layers (smaller with ``quick``)."""
    s = 1 if not quick else 8  # divisor
    rows, hidden, ffn = 8192 // s, 2048 // s, 5632 // s
    seq, heads, head_dim = 4096 // s, 16, 128
    vocab = 32000 // s

    def rms(device, dtype):
        x = torch.randn(rows, hidden, device=device, dtype=dtype)
        return [x, torch.ones(hidden, device=device, dtype=dtype)], {"eps": 1e-6}

    def rms_res(device, dtype):
        (x, w), kw = rms(device, dtype)
        return [x, w], {"eps": 1e-6, "residual": torch.randn_like(x)}

    def swiglu(device, dtype):
        return [torch.randn(rows, 2 * ffn, device=device, dtype=dtype)], {}

    def rope(device, dtype):
        t = torch.randn(seq, 1, heads, head_dim, device=device, dtype=dtype)
        pos = torch.arange(seq, device=device, dtype=torch.float32)
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
        freqs = torch.outer(pos, inv)
        return [t], {"freqs": torch.cat([freqs, freqs], -1)[:, None, None, :]}

    def modulate(device, dtype):
        b, n, d = 8, 1024 // s, 1152 // s
        x = torch.randn(b, n, d, device=device, dtype=dtype)
        return [x, torch.randn(b, 1, d, device=device, dtype=dtype), torch.randn(b, 1, d, device=device,
                                                                                 dtype=dtype)], {"eps": 1e-6}

    def ce(device, dtype):
        return [torch.randn(rows // 2, vocab, device=device, dtype=dtype)], {
            "labels": torch.randint(0, vocab, (rows // 2,), device=device)}

    def lce(device, dtype):
        n, h = rows // 2, hidden // 2
        return [torch.randn(n, h, device=device, dtype=dtype), 0.02 * torch.randn(vocab, h, device=device,
                                                                                  dtype=dtype)], {
            "labels": torch.randint(0, vocab, (n,), device=device)}

    return [
        Case("rms_norm", f"[{rows}, {hidden}]", rms),
        Case("rms_norm", f"[{rows}, {hidden}] + residual", rms_res),
        Case("swiglu", f"[{rows}, 2x{ffn}]", swiglu),
        Case("rope", f"[{seq}, 1, {heads}, {head_dim}]", rope),
        Case("layer_norm_modulate", f"[8, {1024 // s}, {1152 // s}]", modulate),
        Case("cross_entropy", f"[{rows // 2}, {vocab}]", ce),
        Case("linear_cross_entropy", f"[{rows // 2}, {hidden // 2}] x [{vocab}, {hidden // 2}]", lce),
    ]


# ------------------------------------------------------------------------------------------
# Memory: CUDA allocator peak, or the CPU process's resident high-water mark.
# ------------------------------------------------------------------------------------------


def _return_freed_memory_to_the_system() -> None:
    """glibc: serve every allocation of 64 KiB or more by mmap, unmapped when freed."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (also stops its dynamic growth)
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    except OSError:
        pass


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class PeakMemory:
    """Peak bytes a block adds over what was allocated when it started."""

    def __init__(self, device: torch.device):
        self.device = device
        self.extra = 0

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the resident high-water mark to the current RSS
            self._base = _status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.extra = torch.cuda.max_memory_allocated() - self._base
        else:
            self.extra = _status_kib("VmHWM") * 1024 - self._base


# ------------------------------------------------------------------------------------------
# Running one backend.
# ------------------------------------------------------------------------------------------


def _load(op: str, backend: str):
    from loong_core.kernels.resolve import is_available
    from loong_core.plugins import get_registry

    registry = get_registry()
    name = f"{op}:{backend}"
    if not registry.has("kernel", name):
        return None
    entry = registry.get("kernel", name)
    if not is_available(entry):
        return None
    return entry.load()


def _step(fn, inputs: list[torch.Tensor], kwargs: dict, cotangent: torch.Tensor | None):
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    out = fn(*leaves, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    loss = (out * cotangent).sum() if cotangent is not None else out.sum()
    loss.backward()
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _bytes_moved(inputs: list[torch.Tensor], kwargs: dict, out: torch.Tensor) -> int:
    tensors = [*inputs, *(v for v in kwargs.values() if isinstance(v, torch.Tensor))]
    float_in = sum(t.numel() * t.element_size() for t in tensors)
    out_bytes = out.numel() * out.element_size()
    return 3 * float_in + 2 * out_bytes


def bench_case(case: Case, device: torch.device, dtype: torch.dtype, reps: int, backends: list[str]) -> list[dict]:
    """Time and memory of every available backend of ``case``, interleaved."""
    inputs, kwargs = case.make(device, dtype)
    fns = {b: fn for b in backends if (fn := _load(case.op, b)) is not None}
    if not fns:
        return []
    probe = next(iter(fns.values()))(*inputs, **kwargs)
    probe = probe[0] if isinstance(probe, tuple) else probe
    cotangent = torch.randn_like(probe)
    moved = _bytes_moved(inputs, kwargs, probe)
    del probe
    for fn in fns.values():  # warm up (compile)
        _step(fn, inputs, kwargs, cotangent)
    times = {b: [] for b in fns}
    for _ in range(reps):
        for b, fn in fns.items():
            _sync(device)
            start = time.perf_counter()
            _step(fn, inputs, kwargs, cotangent)
            _sync(device)
            times[b].append(time.perf_counter() - start)
    rows = []
    for b, fn in fns.items():
        with PeakMemory(device) as peak:
            _step(fn, inputs, kwargs, cotangent)
        ms = 1e3 * statistics.median(times[b])
        rows.append({"op": case.op, "shape": case.shape, "backend": b, "ms": ms, "mb": moved / 1e6,
                     "gbs": moved / ms / 1e6, "peak_mib": peak.extra / 2 ** 20})
    return rows


def linear_ce_memory(device: torch.device, tokens: int, vocab: int, hidden: int) -> list[dict]:
    """Peak extra memory and time of the unfused loss and the tiled ones, one step each (fp32)."""
    hid = torch.randn(tokens, hidden, device=device)
    weight = 0.02 * torch.randn(vocab, hidden, device=device)
    labels = torch.randint(0, vocab, (tokens,), device=device)
    rows = []
    for backend in ("torch", "chunked", "triton"):
        fn = _load("linear_cross_entropy", backend)
        if fn is None:
            continue
        with PeakMemory(device) as peak:
            _sync(device)
            start = time.perf_counter()
            _step(fn, [hid, weight], {"labels": labels}, None)
            _sync(device)
            seconds = time.perf_counter() - start
        rows.append({"backend": backend, "peak_mib": peak.extra / 2 ** 20, "s": seconds})
        gc.collect()
    return rows


# ------------------------------------------------------------------------------------------
# Output.
# ------------------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ops", default="", help="comma-separated ops (default: all)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--skip-linear-ce", action="store_true", help="skip the 4k x 128k x 1k memory ratio")
    parser.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0: torch's default)")
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cpu":
        _return_freed_memory_to_the_system()
        if args.threads:
            torch.set_num_threads(args.threads)
    wanted = set(filter(None, args.ops.split(",")))
    backends = args.backends.split(",")
    print(f"device {device}, {args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.reps}, backends interleaved")
    rows = []
    for case in _cases(args.quick):
        if not wanted or case.op in wanted:
            rows += bench_case(case, device, dtype, args.reps, backends)
            print(f"  measured {case.op} {case.shape}", file=sys.stderr)
    base = {(r["op"], r["shape"]): r["ms"] for r in rows if r["backend"] == "torch"}
    print(_table(["op", "shape", "backend", "ms", "MB moved", "GB/s", "peak MiB", "speed vs torch"],
                 [[r["op"], r["shape"], r["backend"], f"{r['ms']:.2f}", f"{r['mb']:.0f}", f"{r['gbs']:.1f}",
                   f"{r['peak_mib']:.0f}", f"{base[(r['op'], r['shape'])] / r['ms']:.2f}x"
                   if (r["op"], r["shape"]) in base else "-"] for r in rows]))
    verdict = [[r["op"], r["shape"], f"{base[(r['op'], r['shape'])] / r['ms']:.2f}x",
                "yes" if r["ms"] < base[(r["op"], r["shape"])] else "no"]
               for r in rows if r["backend"] == "compile" and (r["op"], r["shape"]) in base]
    if verdict:
        print(f"\ncompile vs torch on this {device.type}:")
        print(_table(["op", "shape", "compile speed vs torch", "compile faster"], verdict))
    if not args.skip_linear_ce and (not wanted or "linear_cross_entropy" in wanted):
        tokens, vocab, hidden = (4096, 131072, 1024) if not args.quick else (512, 8192, 128)
        mem = linear_ce_memory(device, tokens, vocab, hidden)
        unfused = next(r["peak_mib"] for r in mem if r["backend"] == "torch")
        print(f"\nlinear cross entropy, {tokens} tokens x {vocab} vocab x hidden {hidden}, fp32, forward + backward:")
        print(_table(["backend", "peak extra MiB", "ratio to unfused", "s"],
                     [[r["backend"], f"{r['peak_mib']:.0f}", f"{r['peak_mib'] / unfused:.3f}", f"{r['s']:.1f}"]
                      for r in mem]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
