"""One matrix product per group over rows sorted by group, without a Python loop over the groups.

The groups are a MoE layer's experts (loong_llm's grouped experts) or the robots of a
cross-embodiment policy (loong_embodied's per-embodiment layers); the text says experts.

``grouped_linear(x, weight, counts)``: ``x [T, K]`` holds the tokens of expert 0, then those of
expert 1, ... (``counts[e]`` rows each, as megatron-core's token dispatchers hand them to the
experts), ``weight [E, N, K]`` one ``nn.Linear``-style matrix per expert; the result ``[T, N]``
has row ``t`` = ``x[t] @ weight[e].T`` for the expert ``e`` of the row.

Two ways, the same numbers:

- ``torch._grouped_mm`` (one op; on CPU torch runs one GEMM per group inside it) wherever it
  runs for the device, dtype and sizes: probed once per combination with a tiny forward and
  backward, since its support differs by device (CUDA: recent GPUs), dtype and alignment.
- otherwise the rows are scattered into a zero-padded ``[E, max(counts), K]`` block and multiplied
  by one batched ``bmm``, then gathered back (padding rows are zeros and are never read).

Experts without tokens still take part in the product, so their weights always get a (zero)
gradient, as megatron-core's optimizer expects of every parameter.

Row buckets (:func:`row_bucket`, :func:`bucket_rows`): on a CPU, a bf16 / fp16 matrix product
goes through oneDNN, which builds (JIT-compiles) a kernel per new shape and caches it; the
tokens each expert receives change every step, so nearly every per-expert product of a MoE step
had a shape not seen before. Measured on a 2-vCPU AVX512-BF16 EPYC, ``[M, 256] x [256, 128]``,
M drawn from 150..360: 378 us per bf16 product against 69 us at a fixed M (fp32: 129 vs 124 us,
MKL builds nothing per shape), and 76 us with M rounded up to a multiple of 64. So in reduced
precision on a CPU each expert's rows are padded with zero rows up to a multiple of
:data:`CPU_ROW_BUCKET`: a few shapes, built once, for a few padding rows.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

_SUPPORT: dict[tuple, bool] = {}


def grouped_mm_supported(device: torch.device, dtype: torch.dtype, k: int, n: int) -> bool:
    """Whether ``torch._grouped_mm`` runs forward and backward for ``[*, k] x [E, k, n]`` here."""
    key = (device.type, device.index, dtype, k, n)
    if key not in _SUPPORT:
        _SUPPORT[key] = _probe(device, dtype, k, n)
        if not _SUPPORT[key]:
            logger.info("torch._grouped_mm does not run for %s %s (k=%d, n=%d): experts use the "
                        "padded batched matmul", device, dtype, k, n)
    return _SUPPORT[key]


def _probe(device: torch.device, dtype: torch.dtype, k: int, n: int) -> bool:
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        with torch.inference_mode(False), torch.enable_grad():  # also when called under either
            x = torch.zeros(16, k, device=device, dtype=dtype, requires_grad=True)
            w = torch.zeros(2, n, k, device=device, dtype=dtype, requires_grad=True)
            offs = torch.tensor([8, 16], device=device, dtype=torch.int32)
            y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
            y.backward(torch.ones_like(y))
        return True
    except (RuntimeError, NotImplementedError, TypeError):
        return False


CPU_ROW_BUCKET = 32
"""Rows per expert are padded to a multiple of this in bf16 / fp16 on a CPU (module docstring)."""


def row_bucket(x: torch.Tensor) -> int:
    """The multiple each expert's rows of ``x`` are padded to (0: no padding): :data:`CPU_ROW_BUCKET`
    for bf16 / fp16 on a CPU, where each new product shape costs a kernel build."""
    return CPU_ROW_BUCKET if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16) else 0


def bucket_rows(counts: torch.Tensor, bucket: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Where each of ``rows`` rows sorted by expert (``counts [E]`` each) goes once every expert's
    group is padded with zero rows up to a multiple of ``bucket``.

    Returns:
        ``(destination [rows], padded counts [E], padded rows)``: row ``t`` moves to
        ``destination[t]`` (scatter with :func:`pad_rows`, gather back with ``index_select``).
    """
    counts = counts.to(dtype=torch.long)
    padded = (counts + bucket - 1) // bucket * bucket
    experts = torch.arange(counts.shape[0], device=counts.device)
    expert_of_row = torch.repeat_interleave(experts, counts, output_size=rows)
    shift = (torch.cumsum(padded, 0) - padded) - (torch.cumsum(counts, 0) - counts)
    destination = torch.arange(rows, device=counts.device) + shift[expert_of_row]
    return destination, padded, int(padded.sum())


def pad_rows(x: torch.Tensor, destination: torch.Tensor, padded_rows: int) -> torch.Tensor:
    """``x [T, ...]`` placed at ``destination`` in zeros ``[padded_rows, ...]`` (differentiable)."""
    return x.new_zeros(padded_rows, *x.shape[1:]).index_copy(0, destination, x)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor,
                   use_grouped_mm: bool | None = None) -> torch.Tensor:
    """``x @ weight[e].T`` for each expert's rows of ``x`` (see the module docstring).

    Args:
        x: ``[T, K]`` rows sorted by expert.
        weight: ``[E, N, K]``.
        counts: ``[E]`` rows per expert (any integer dtype, any device), summing to ``T``.
        use_grouped_mm: Force one path (None: ``torch._grouped_mm`` where it runs).

    Returns:
        ``[T, N]``.
    """
    if use_grouped_mm is None:
        use_grouped_mm = grouped_mm_supported(x.device, x.dtype, weight.shape[2], weight.shape[1])
    if use_grouped_mm:
        offs = torch.cumsum(counts.to(device=x.device), 0, dtype=torch.int32)
        out = torch._grouped_mm(x, weight.transpose(-2, -1), offs=offs)
        if out.requires_grad:
            # its backward refuses a gradient with zero strides (e.g. of ``out.sum()``)
            out.register_hook(torch.Tensor.contiguous)
        return out
    return _padded_bmm(x, weight, counts)


def _padded_bmm(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    experts = weight.shape[0]
    counts = counts.to(device=x.device, dtype=torch.long)
    width = int(counts.max()) if experts else 0
    expert_of_row = torch.repeat_interleave(torch.arange(experts, device=x.device), counts,
                                            output_size=x.shape[0])
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(x.shape[0], device=x.device) - starts[expert_of_row]
    padded = x.new_zeros(experts, width, x.shape[1])
    padded = padded.index_put((expert_of_row, slot), x)
    out = torch.bmm(padded, weight.transpose(-2, -1))
    return out[expert_of_row, slot]
