"""Layers with one weight per embodiment (robot, domain), each sample through its own.

Cross-embodiment policies hold a linear layer per embodiment: GR00T's state and action encoders
and action decoder (``CategorySpecificLinear``), X-VLA's domain-aware action encoder, decoder and
projections. LeRobot gathers a ``[B, in, out]`` weight per sample and runs a batched matmul (and
scatters the gradients back). Here a batch is grouped once per forward (:class:`EmbodimentGroups`):

- a batch of one embodiment runs one plain ``F.linear`` with that embodiment's weight;
- a mixed batch is sorted by embodiment once, every per-embodiment layer runs as one grouped
  matrix product over the sorted rows (:func:`loong_core.kernels.grouped_matmul.grouped_linear`:
  one GEMM per embodiment inside one op, or the padded batched matmul where ``torch._grouped_mm``
  does not run), and the result is put back in the batch's order once. In bf16 / fp16 on a CPU each
  embodiment's rows are padded to a few fixed sizes, since oneDNN builds a kernel per new product
  shape and a mixed batch's per-embodiment row counts change at every step.

Measured on a 2-vCPU AVX512-BF16 EPYC, GR00T's action MLP (512 -> 256 -> 256, 32 samples x 16
actions, 4 embodiments) forward + backward under bf16 autocast: see docs/performance.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loong_core.errors import ConfigError
from loong_core.kernels import grouped_matmul


class EmbodimentGroups:
    """The samples of a batch grouped by embodiment id.

    Args:
        ids: Embodiment id of each sample ``[B]`` (integers).
        num_embodiments: How many embodiments the layers hold (ids must be below it).
        setting: The config key of ``num_embodiments``, named in the error.

    Attributes:
        single: The embodiment of every sample when the batch has one, else None.
        order: Sample indices sorted by embodiment (stable; mixed batches only).
        inverse: Where each sample sits in ``order`` (mixed batches only).
        counts: Samples per embodiment ``[num_embodiments]`` (mixed batches only).

    Raises:
        ConfigError: An id is outside ``[0, num_embodiments)``.
    """

    def __init__(self, ids: torch.Tensor, num_embodiments: int, setting: str = "model.num_embodiments"):
        ids = torch.as_tensor(ids).reshape(-1).long()
        present = [int(e) for e in torch.unique(ids).tolist()]   # one host sync per forward
        bad = [e for e in present if not 0 <= e < num_embodiments]
        if bad:
            raise ConfigError(f"embodiment id(s) {bad} in the batch, but {setting}={num_embodiments}: "
                              f"raise {setting} or fix the dataset's embodiment / domain id")
        self.num_embodiments = num_embodiments
        self.single: int | None = present[0] if len(present) == 1 else None
        if self.single is None:
            self.order = torch.argsort(ids, stable=True)
            self.inverse = torch.argsort(self.order)
            self.counts = torch.bincount(ids, minlength=num_embodiments)

    def sort(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, ...]`` in embodiment order (unchanged for a single-embodiment batch)."""
        return x if self.single is not None else x.index_select(0, self.order)

    def unsort(self, x: torch.Tensor) -> torch.Tensor:
        """Undoes :meth:`sort`."""
        return x if self.single is not None else x.index_select(0, self.inverse)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Each sample's rows of ``x [B, ..., in]`` (in :meth:`sort`'s order for a mixed batch) through
        its embodiment's ``weight [E, out, in]`` and ``bias [E, out]`` -> ``[B, ..., out]``."""
        if self.single is not None:
            b = None if bias is None else bias[self.single]
            return F.linear(x, weight[self.single], b)
        rows_per_sample = x[0].numel() // x.shape[-1] if x.shape[0] else 1
        flat = x.reshape(-1, x.shape[-1])
        if torch.is_autocast_enabled(x.device.type):   # as F.linear under autocast: low-precision products
            dtype = torch.get_autocast_dtype(x.device.type)
            flat, weight = flat.to(dtype), weight.to(dtype)
        counts = self.counts * rows_per_sample
        rows = flat.shape[0]
        bucket = grouped_matmul.row_bucket(flat)
        if bucket:   # a few product shapes in bf16 / fp16 on a CPU (module docstring)
            destination, counts, padded = grouped_matmul.bucket_rows(counts, bucket, rows)
            out = grouped_matmul.grouped_linear(grouped_matmul.pad_rows(flat, destination, padded), weight, counts)
            out = out.index_select(0, destination)
        else:
            out = grouped_matmul.grouped_linear(flat, weight, counts)
        if bias is not None:
            out = out + bias.to(out.dtype).index_select(0, self._row_embodiments(rows_per_sample, rows).to(x.device))
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def _row_embodiments(self, rows_per_sample: int, rows: int) -> torch.Tensor:
        embodiments = torch.arange(self.num_embodiments, device=self.counts.device)
        return torch.repeat_interleave(embodiments, self.counts * rows_per_sample, output_size=rows)
