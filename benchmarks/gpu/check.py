"""The GPU check of the Triton kernels (run by ``check.sh``): correctness, bandwidth, Llama tokens/s.

    python benchmarks/gpu/check.py correctness     # every kernel vs its torch reference, bf16 + fp32
    python benchmarks/gpu/check.py bandwidth       # GB/s per kernel against a device-to-device copy
    python benchmarks/gpu/check.py fp8             # Linear-heavy MLP: bf16 vs FP8 tensorwise / rowwise
    python benchmarks/gpu/check.py grouped         # per-group products (experts, embodiments) vs a loop
    python benchmarks/gpu/check.py llama           # ~100M Llama, 20 steps, kernels=torch vs triton
    python benchmarks/gpu/check.py all --dry-run   # tiny shapes on CPU (Triton's interpreter)

``--dry-run`` runs every code path on CPU with tiny shapes in Triton's interpreter (the numbers are
meaningless there); it is how the script is tested without a GPU. Needs only torch, triton and the
``loong_core`` / ``loong_kernels`` sources for the first two parts; the third runs ``loong train``
(loong_core, loong_llm, loong_kernels installed, with megatron-core and hydra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is decorated

import torch  # noqa: E402

from loong_core.kernels import reference  # noqa: E402
from loong_kernels.chunked.linear_cross_entropy import linear_cross_entropy as chunked_lce  # noqa: E402
from loong_kernels.triton.cross_entropy import cross_entropy  # noqa: E402
from loong_kernels.triton.indexer_topk import indexer_topk  # noqa: E402
from loong_kernels.triton.layer_norm_modulate import layer_norm_modulate  # noqa: E402
from loong_kernels.triton.linear_cross_entropy import linear_cross_entropy  # noqa: E402
from loong_kernels.triton.rms_norm import rms_norm  # noqa: E402
from loong_kernels.triton.rope import rope  # noqa: E402
from loong_kernels.triton.sparse_attention import sparse_attention  # noqa: E402
from loong_kernels.triton.swiglu import swiglu  # noqa: E402

DEVICE = torch.device("cpu" if DRY else "cuda")
# Largest error relative to the reference's largest magnitude, per output and gradient.
LIMIT = {torch.bfloat16: 2 ** -6, torch.float32: 1e-5}


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def _rope_freqs(s: int, d: int, halves_equal: bool = True) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=DEVICE, dtype=torch.float32) / d))
    f = torch.outer(torch.arange(s, device=DEVICE, dtype=torch.float32), inv)
    second = f if halves_equal else f.flip(-1)  # any layout (MRoPE sections) reads both halves
    return torch.cat([f, second], -1)[:, None, None, :]


def _cases(dtype: torch.dtype) -> list[tuple]:
    """(name, kernel, reference, float inputs, other kwargs) at large (GPU) or tiny (dry) shapes."""
    big = not DRY
    r, h = (4096, 4096) if big else (9, 40)
    s, heads, d = (2048, 32, 128) if big else (5, 3, 16)
    v = 32000 if big else 300
    t = lambda *shape: torch.randn(*shape, device=DEVICE, dtype=dtype)  # noqa: E731
    labels = torch.randint(0, v, (r,), device=DEVICE)
    odd_r, odd_h = (1000, 3000) if big else (7, 37)
    hidden = 2048 if big else 16
    ds, dh, topk = (4096, 16, 2048) if big else (21, 2, 7)  # DeepSeek sparse attention
    idx = _dsa_selection(ds, topk)
    sparse = lambda impl: lambda q, k, v: impl(q, k, v, idx, 96 ** -0.5)  # noqa: E731
    return [
        ("rms_norm", lambda x, w: rms_norm(x, w, 1e-6), lambda x, w: reference.rms_norm(x, w, 1e-6),
         [t(r, h), t(h)], {}),
        ("rms_norm odd", lambda x, w: rms_norm(x, w, 1e-6), lambda x, w: reference.rms_norm(x, w, 1e-6),
         [t(odd_r, odd_h), t(odd_h)], {}),
        ("rms_norm + residual", lambda x, w, res: rms_norm(x, w, 1e-6, res),
         lambda x, w, res: reference.rms_norm(x, w, 1e-6, res), [t(r, h), t(h), t(r, h)], {}),
        ("swiglu", swiglu, reference.swiglu, [t(r, 2 * (11008 if big else 44))], {}),
        ("rope", lambda q: rope(q, _rope_freqs(s, d)), lambda q: reference.rope(q, _rope_freqs(s, d)),
         [t(s, 2, heads, d)], {}),
        ("rope mrope-like partial", lambda q: rope(q, _rope_freqs(s, d // 2, False)),
         lambda q: reference.rope(q, _rope_freqs(s, d // 2, False)), [t(s, 2, heads, d)], {}),
        ("layer_norm_modulate", lambda x, a, b: layer_norm_modulate(x, a, b, 1e-6),
         lambda x, a, b: reference.layer_norm_modulate(x, a, b, 1e-6),
         [t(4, s // 2, 1152 if big else 24), t(4, 1, 1152 if big else 24), t(4, 1, 1152 if big else 24)], {}),
        ("layer_norm_modulate per token", lambda x, a, b: layer_norm_modulate(x, a, b, 1e-6),
         lambda x, a, b: reference.layer_norm_modulate(x, a, b, 1e-6),
         [t(4, s // 2, 1152 if big else 24), t(4, s // 2, 1152 if big else 24), t(4, s // 2, 1152 if big else 24)],
         {}),
        ("cross_entropy ls=0.1", lambda z: cross_entropy(z, labels, 0.1),
         lambda z: reference.cross_entropy(z, labels, 0.1), [3 * t(r, v)], {}),
        ("linear_cross_entropy", lambda x, w: linear_cross_entropy(x, w, labels),
         lambda x, w: reference.linear_cross_entropy(x, w, labels), [t(r, hidden), 0.02 * t(v, hidden)], {}),
        ("linear_cross_entropy chunked", lambda x, w: chunked_lce(x, w, labels),
         lambda x, w: reference.linear_cross_entropy(x, w, labels), [t(r, hidden), 0.02 * t(v, hidden)], {}),
        (f"sparse_attention top-{topk} of {ds}", sparse(sparse_attention), sparse(reference.sparse_attention),
         [t(ds, 1, dh, 96), t(ds, 1, dh, 96), t(ds, 1, dh, 64)], {}),
        *_gated_delta_cases(t),
    ]


def _gated_delta_cases(t) -> list[tuple]:
    """gated_delta_rule:fla (flash-linear-attention, when installed: the wheels of ``--build-wheels``)
    against the chunked torch reference, two packed documents per row. Skipped in a dry run: fla
    runs in Triton's interpreter only with the test patches of loong_kernels' fla test."""
    import importlib.util

    if DRY or importlib.util.find_spec("fla") is None:
        return []
    from loong_kernels.fla.gated_delta_rule import gated_delta_rule as fla_rule

    b, s, h, dk, dv = 2, 4096, 8, 128, 128
    segments = (torch.arange(s, device=DEVICE) >= s // 3).int().expand(b, s).contiguous()

    def wrap(impl):
        def run(q, k, v, g, beta):
            q, k = (torch.nn.functional.normalize(x.float(), dim=-1).to(x.dtype) for x in (q, k))
            return impl(q, k, v, torch.nn.functional.logsigmoid(g.float()), beta.sigmoid(), dk ** -0.5,
                        segment_ids=segments)
        return run

    return [(f"gated_delta_rule fla, {s} tokens x {h} heads", wrap(fla_rule), wrap(reference.gated_delta_rule),
             [t(b, s, h, dk), t(b, s, h, dk), t(b, s, h, dv), t(b, s, h), t(b, s, h)], {})]


def _dsa_selection(s: int, topk: int) -> torch.Tensor:
    """``[1, s, topk]`` causal top-k of random lightning-indexer scores (the torch reference)."""
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    q, k, w = (torch.randn(*shape, device=DEVICE, generator=gen) for shape in
               ((s, 1, 4, 64), (s, 1, 64), (s, 1, 4)))
    return reference.indexer_topk(q, k, w, topk)


def indexer_correctness() -> list[str]:
    """indexer_topk:triton vs the reference: the same causal keys up to ties (scores compared)."""
    from loong_core.kernels.sparse_attention import indexer_scores

    s, topk = (4096, 2048) if not DRY else (21, 5)
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    q, k, w = (torch.randn(*shape, device=DEVICE, generator=gen) for shape in
               ((s, 1, 4, 64), (s, 1, 64), (s, 1, 4)))
    got, want = indexer_topk(q, k, w, topk), reference.indexer_topk(q, k, w, topk)
    causal = torch.arange(s, device=DEVICE).view(1, -1, 1)
    valid = want <= causal
    scores = indexer_scores(q, k, w)
    error = _relative_error(scores.gather(-1, got)[valid], scores.gather(-1, want)[valid])
    passed = torch.equal(got <= causal, valid) and error <= LIMIT[torch.float32]
    return [f"indexer_topk top-{topk} of {s}", "float32", f"{error:.2e} (selected scores)", "-",
            "ok" if passed else "FAIL"]


def _run(fn, inputs, cotangents=None):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    if cotangents is None:
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        cotangents = [torch.randn(o.shape, device=DEVICE, generator=gen).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, cotangents)
    return outs, [x.grad for x in leaves], cotangents


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item()


def correctness() -> bool:
    """Every kernel against its reference on real Triton; prints a table, True when all pass."""
    rows, ok = [], True
    for dtype in (torch.bfloat16, torch.float32):
        torch.manual_seed(0)
        for name, fn, ref, inputs, _ in _cases(dtype):
            outs, grads, cot = _run(fn, inputs)
            ref_outs, ref_grads, _ = _run(ref, inputs, cot)
            errors = [_relative_error(a, b) for a, b in zip(outs, ref_outs)]
            errors += [_relative_error(a, b) for a, b in zip(grads, ref_grads)]
            passed = all(e <= LIMIT[dtype] for e in errors) and all(
                a.dtype == b.dtype for a, b in zip(outs, ref_outs))
            ok &= passed
            rows.append([name, str(dtype).replace("torch.", ""), f"{max(errors[:len(outs)]):.2e}",
                         f"{max(errors[len(outs):]):.2e}", "ok" if passed else "FAIL"])
    rows.append(indexer_correctness())
    ok &= rows[-1][-1] == "ok"
    print("correctness: largest |kernel - reference| / largest |reference|, outputs and input gradients "
          f"(limit bf16 {LIMIT[torch.bfloat16]:.2e}, fp32 {LIMIT[torch.float32]:.0e})")
    print(_table(["kernel", "dtype", "output", "gradients", "result"], rows))
    return ok


def _ms(fn, reps: int) -> float:
    """Median milliseconds of ``fn`` (CUDA events on GPU, wall time in a dry run)."""
    fn()
    times = []
    for _ in range(reps):
        if DEVICE.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def bandwidth(reps: int = 20) -> None:
    """GB/s of each kernel's forward and backward (least bytes it must move) against a copy."""
    big = not DRY
    n = (1 << 28) if big else (1 << 12)  # bf16 elements: 512 MiB
    src = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() * 2 / _ms(lambda: dst.copy_(src), reps) / 1e6
    src = dst = None  # free the copy buffers
    rows_, width = (16384, 8192) if big else (8, 64)
    s, b, heads, d = (8192, 2, 32, 128) if big else (4, 1, 2, 16)
    bf = torch.bfloat16
    t = lambda *shape: torch.randn(*shape, device=DEVICE, dtype=bf)  # noqa: E731
    labels = torch.randint(0, 128256 if big else 500, (4096 if big else 8,), device=DEVICE)
    freqs = _rope_freqs(s, d)
    cases = [  # name, triton fn, torch fn, inputs, forward bytes, backward bytes (per element count)
        ("rms_norm", lambda x, w: rms_norm(x, w, 1e-6), lambda x, w: reference.rms_norm(x, w, 1e-6),
         [t(rows_, width), t(width)], 2, 3),
        ("rms_norm + residual", lambda x, w, r: rms_norm(x, w, 1e-6, r)[0],
         lambda x, w, r: reference.rms_norm(x, w, 1e-6, r)[0], [t(rows_, width), t(width), t(rows_, width)], 4, 3),
        ("swiglu", swiglu, reference.swiglu, [t(rows_, 2 * width)], 1.5, 2.5),
        ("rope", lambda q: rope(q, freqs), lambda q: reference.rope(q, freqs), [t(s, b, heads, d)], 2, 2),
        ("layer_norm_modulate", lambda x, a, c: layer_norm_modulate(x, a, c, 1e-6),
         lambda x, a, c: reference.layer_norm_modulate(x, a, c, 1e-6),
         [t(8, rows_ // 8, width), t(8, 1, width), t(8, 1, width)], 2, 3),
        ("cross_entropy", lambda z: cross_entropy(z, labels), lambda z: reference.cross_entropy(z, labels),
         [t(labels.numel(), 128256 if big else 500)], 1, 2),
    ]
    table = []
    for name, fn, ref, inputs, fwd_per, bwd_per in cases:
        elements = inputs[0].numel()
        for impl, f in (("triton", fn), ("torch", ref)):
            leaves = [x.detach().requires_grad_() for x in inputs]
            fwd_ms = _ms(lambda: f(*leaves), reps)  # noqa: B023
            out = f(*leaves)
            cot = torch.randn_like(out)
            bwd_ms = _ms(lambda: torch.autograd.grad(out, leaves, cot, retain_graph=True), reps)  # noqa: B023
            fwd_gbs = fwd_per * elements * 2 / fwd_ms / 1e6
            bwd_gbs = bwd_per * elements * 2 / bwd_ms / 1e6
            table.append([name, impl, f"{fwd_ms:.3f}", f"{fwd_gbs:.0f}", f"{100 * fwd_gbs / copy_gbs:.0f}%",
                          f"{bwd_ms:.3f}", f"{bwd_gbs:.0f}", f"{100 * bwd_gbs / copy_gbs:.0f}%"])
    print(f"\nbandwidth, bf16 (device-to-device copy: {copy_gbs:.0f} GB/s; goal >= 80% for rms_norm, swiglu, rope); "
          f"bytes = the least each pass must read + write (backward: 'torch' also recomputes in autograd)")
    print(_table(["kernel", "impl", "fwd ms", "fwd GB/s", "fwd % copy", "bwd ms", "bwd GB/s", "bwd % copy"], table))


def _fp8_mlp(dim: int, hidden: int, layers: int) -> torch.nn.Module:
    """A Linear-heavy stack: ``layers`` x (Linear dim->hidden, GELU, Linear hidden->dim), bf16."""
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(dim, hidden, bias=False), torch.nn.GELU(), torch.nn.Linear(hidden, dim, bias=False)]
    return torch.nn.Sequential(*mods).to(DEVICE, torch.bfloat16)


def fp8(reps: int = 20) -> bool:
    """Forward + backward ms of a Linear-heavy MLP in bf16, FP8 tensorwise and FP8 rowwise (torchao
    float8 as ``parallel.fp8_format`` uses it, each under ``torch.compile`` on the GPU; emulated and
    eager in a dry run), with TFLOP/s, the speed-up over bf16 and the output's distance to bf16."""
    import dataclasses
    import logging

    logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA extensions' load messages
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        print("\nfp8: torchao is not installed (pip install torchao==0.18.0): FP8 rows skipped")
        return False
    tokens, dim, hidden, layers = (16384, 4096, 16384, 4) if not DRY else (32, 64, 128, 2)
    flops = 6 * tokens * 2 * dim * hidden * layers  # forward (2) + backward (4) FLOPs per MAC
    torch.manual_seed(0)
    reference = _fp8_mlp(dim, hidden, layers)
    x = torch.randn(tokens, dim, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    table, base_ms, base_out = [], None, None
    for name in ("bf16", "tensorwise", "rowwise"):
        model = _fp8_mlp(dim, hidden, layers)
        model.load_state_dict(reference.state_dict())
        if name != "bf16":
            config = dataclasses.replace(Float8LinearConfig.from_recipe_name(name), emulate=DRY)
            convert_to_float8_training(model, config=config)
        step = model if DRY else torch.compile(model)

        def run():
            step(x).sum().backward()  # noqa: B023

        for _ in range(2):  # compile and warm up
            run()
        ms = _ms(run, reps)
        with torch.no_grad():
            out = step(x).float()
        if base_out is None:
            base_ms, base_out = ms, out
        diff = ((out - base_out).norm() / base_out.norm()).item()
        table.append([name if name == "bf16" else f"fp8 {name}", f"{ms:.2f}", f"{flops / ms / 1e9:.0f}",
                      f"{base_ms / ms:.2f}x", f"{diff:.1e}"])
        step = model = None
    print(f"\nfp8 training speed: {layers} x (Linear {dim}->{hidden}, GELU, Linear {hidden}->{dim}), "
          f"{tokens} tokens, forward + backward, torchao float8"
          + (" (dry run: emulated, eager; numbers meaningless)" if DRY else ", torch.compile"))
    print(_table(["precision", "ms", "TFLOP/s", "vs bf16", "output vs bf16"], table))
    return True


LLAMA_100M = ["experiment=llama_debug", "model.num_layers=12", "model.hidden_size=768",
              "model.num_attention_heads=12", "model.num_query_groups=4", "model.ffn_hidden_size=2048",
              "model.max_position_embeddings=1024", "data.vocab_size=8192", "data.seq_length=1024",
              "trainer.micro_batch_size=8", "trainer.global_batch_size=8", "trainer.train_iters=20",
              "trainer.log_interval=1", "trainer.eval_interval=0", "trainer.progress_bar=false",
              "trainer.tensorboard=false", "trainer.save_at_end=false", "parallel.mixed_precision=bf16"]
LLAMA_DRY = ["experiment=llama_debug", "trainer.train_iters=2", "trainer.global_batch_size=2",
             "trainer.micro_batch_size=1", "trainer.log_interval=1", "trainer.eval_interval=0",
             "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.save_at_end=false"]
TRITON_OPS = ["rms_norm", "swiglu", "rope", "cross_entropy", "linear_cross_entropy"]


def llama(root: Path) -> bool:
    """tokens/s of the ~100M Llama, 20 steps, every op on torch, then on triton (steps 6-20)."""
    overrides = LLAMA_DRY if DRY else LLAMA_100M
    table, ok = [], True
    for backend in ("torch", "triton"):
        run_dir = root / backend
        cmd = [sys.executable, "-m", "loong_core.cli.main", "train", *overrides,
               *[f"kernels.{op}={backend}" for op in TRITON_OPS], f"trainer.run_dir={run_dir}"]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"loong train with kernels={backend} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
            ok = False
            continue
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in records if r.get("split", "train") == "train" and "tokens_per_sec" in r]
        steady = [r["tokens_per_sec"] for r in train[5:]] or [r["tokens_per_sec"] for r in train]
        table.append([backend, f"{statistics.median(steady):.0f}", f"{train[-1]['loss']:.4f}",
                      f"{time.perf_counter() - started:.0f}"])
    if table:
        print(f"\nLlama ({'dry run: llama_debug' if DRY else '~100M: 12 x 768, vocab 8192, seq 1024, bf16'}), "
              f"{len(table)} runs, median tokens/s after 5 warm-up steps")
        print(_table(["kernels", "tokens/s", "last loss", "wall s"], table))
        if len(table) == 2:
            print(f"triton / torch tokens/s: {float(table[1][1]) / float(table[0][1]):.2f}x")
    return ok


def grouped(reps: int = 20) -> bool:
    """Per-group products (MoE experts, robot embodiments), ``loong_core.kernels.grouped_matmul``:
    ``torch._grouped_mm`` (where its probe says it runs) and the padded batched matmul against a loop
    over the groups, forward and gradients, bf16 and fp32; then a mixed-embodiment GR00T MLP
    (512 -> 256 -> 256, 4 embodiments, 32 samples x 16 actions, bf16 autocast) as loong runs it
    (sorted once, grouped products) against LeRobot's way (a weight gathered per sample, ``bmm``):
    ms per forward + backward. Needs ``loong_embodied``'s sources on PYTHONPATH."""
    from loong_core.kernels.grouped_matmul import grouped_linear, grouped_mm_supported
    from loong_embodied.policies.common.embodiment import EmbodimentGroups
    from loong_embodied.policies.groot.embodiment import EmbodimentMLP

    rows, ok = [], True
    counts = torch.tensor([3, 0, 5, 1] if DRY else [96, 0, 160, 32])
    k, n = (16, 8) if DRY else (256, 512)
    bounds = torch.cumsum(counts, 0).tolist()

    def loop(x, w):
        starts = [0] + bounds[:-1]
        return torch.cat([x[a:b] @ w[e].T for e, (a, b) in enumerate(zip(starts, bounds))])

    for dtype in (torch.bfloat16, torch.float32):
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        x = torch.randn(int(counts.sum()), k, device=DEVICE, generator=gen).to(dtype)
        w = torch.randn(4, n, k, device=DEVICE, generator=gen).to(dtype) / k ** 0.5

        ref_outs, ref_grads, cot = _run(loop, [x, w])
        paths = [True, False] if grouped_mm_supported(DEVICE, dtype, k, n) else [False]
        for use in paths:
            outs, grads, _ = _run(lambda x, w, use=use: grouped_linear(x, w, counts, use_grouped_mm=use), [x, w], cot)
            errors = [_relative_error(outs[0], ref_outs[0])] + [_relative_error(a, b) for a, b in zip(grads, ref_grads)]
            passed = all(e <= LIMIT[dtype] for e in errors) and grads[1][1].abs().max().item() == 0
            ok &= passed
            rows.append(["grouped_mm" if use else "padded bmm", str(dtype).replace("torch.", ""),
                         f"{errors[0]:.2e}", f"{max(errors[1:]):.2e}", "ok" if passed else "FAIL"])
    print("grouped products: largest |path - per-group loop| / largest |loop|, outputs and gradients "
          "(the empty group's weight gradient must be zero)")
    print(_table(["path", "dtype", "output", "gradients", "result"], rows))

    torch.manual_seed(0)
    width, batch, actions, embodiments = (16, 4, 2, 3) if DRY else (256, 32, 16, 4)
    mlp = EmbodimentMLP(embodiments, [2 * width, width, width]).to(DEVICE)
    x = torch.randn(batch, actions, 2 * width, device=DEVICE)
    ids = torch.arange(batch, device=DEVICE) % embodiments

    def loong_step():
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            out = mlp(x, EmbodimentGroups(ids, embodiments))
        out.float().square().mean().backward()

    def gathered_step():   # LeRobot's CategorySpecificLinear: W[ids] per sample, bmm
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            h = x
            for i, layer in enumerate(mlp.layers):
                h = torch.bmm(h, layer.weight[ids].transpose(1, 2)) + layer.bias[ids][:, None]
                h = mlp.activation(h) if i < len(mlp.layers) - 1 else h
        h.float().square().mean().backward()

    loong_ms, gathered_ms = _ms(loong_step, reps), _ms(gathered_step, reps)
    print(f"mixed-embodiment MLP, forward + backward, bf16 autocast: loong (sorted, grouped) {loong_ms:.3f} ms, "
          f"per-sample weight gather + bmm {gathered_ms:.3f} ms ({gathered_ms / loong_ms:.2f}x)")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=["correctness", "bandwidth", "fp8", "grouped", "llama", "all"])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU in Triton's interpreter")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if not DRY and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run to exercise the script on CPU", file=sys.stderr)
        return 2
    ok = True
    if args.part in ("correctness", "all"):
        ok &= correctness()
    if args.part in ("bandwidth", "all"):
        bandwidth(3 if DRY else args.reps)
    if args.part in ("fp8", "all"):
        ok &= fp8(3 if DRY else args.reps)
    if args.part in ("grouped", "all"):
        ok &= grouped(3 if DRY else args.reps)
    if args.part in ("llama", "all"):
        with tempfile.TemporaryDirectory() as root:
            ok &= llama(Path(root))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
