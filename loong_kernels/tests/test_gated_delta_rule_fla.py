"""``gated_delta_rule:fla`` (flash-linear-attention's chunked kernel) equals the torch reference,
forward and the gradients of q, k, v, g, beta, with and without packed documents (fp32, 1e-5).

fla 0.6.0 does not run in Triton's CPU interpreter as it is; two test-only patches make it:

- its autotuner benchmarks every config, which needs a GPU driver ("0 active drivers"): here
  every config times 0, so the first one runs;
- ``chunk_gated_delta_rule_fwd_kernel_h`` calls ``i_t.to(tl.int64)`` on a ``range`` counter,
  a Python int in the interpreter: here ``range`` in fla's modules yields ints with ``.to``.

fla's kernels must be decorated with ``TRITON_INTERPRET=1`` set, so this module imports fla
itself; when something imported fla before (then compiled for a GPU), the tests skip.
"""

from __future__ import annotations

import builtins
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from loong_core.kernels import reference
from loong_kernels.availability import fla_available
from loong_kernels.fla.gated_delta_rule import cu_seqlens, gated_delta_rule
from loong_kernels.testing import check

_IMPORTED_BEFORE = "fla" in sys.modules
_saved = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("fla.ops.gated_delta_rule", reason="fla-core not installed (pip install 'loong-kernels[fla]')")
if _saved is None:
    del os.environ["TRITON_INTERPRET"]
else:
    os.environ["TRITON_INTERPRET"] = _saved


class _Counter(int):
    """A loop counter that, like a compiled Triton scalar, has ``.to(dtype)``."""

    def to(self, *args, **kwargs):
        return self


def _range(*args):
    return (_Counter(i) for i in builtins.range(*args))


@pytest.fixture(scope="module", autouse=True)
def fla_interpreted():
    """The two patches above, for this module only."""
    if _IMPORTED_BEFORE:
        pytest.skip("fla was imported before this module, not under TRITON_INTERPRET=1; run it alone")
    import triton.runtime.autotuner as autotuner

    patch = pytest.MonkeyPatch()
    patch.setattr(autotuner.Autotuner, "_bench", lambda self, *a, config, **kw: [0.0, 0.0, 0.0])
    for name, module in list(sys.modules.items()):
        if name.startswith("fla.ops") and module is not None:
            patch.setattr(module, "range", _range, raising=False)
    yield
    patch.undo()


def inputs(b, s, h=2, dk=16, dv=32):
    q, k = (F.normalize(torch.randn(b, s, h, dk), dim=-1) for _ in range(2))
    return [q, k, torch.randn(b, s, h, dv), F.logsigmoid(torch.randn(b, s, h) + 2.0),
            torch.sigmoid(torch.randn(b, s, h))]


def test_fla_equals_the_reference_forward_and_backward():
    check(lambda *a: gated_delta_rule(*a, 0.25), lambda *a: reference.gated_delta_rule(*a, 0.25),
          inputs(2, 80), torch.float32, "gated_delta_rule:fla")


def test_fla_keeps_packed_documents_apart_as_the_reference_does():
    ids = torch.tensor([[0] * 30 + [1] * 50, [4] * 70 + [2] * 10])
    check(lambda *a: gated_delta_rule(*a, 0.25, ids),
          lambda *a: reference.gated_delta_rule(*a, 0.25, ids),
          inputs(2, 80), torch.float32, "gated_delta_rule:fla packed")


def test_cu_seqlens_start_a_document_at_each_row_and_each_id_change():
    ids = torch.tensor([[0, 0, 1, 1, 0], [3, 3, 3, 3, 3]])
    assert cu_seqlens(ids).tolist() == [0, 2, 4, 5, 10]


def test_fla_is_available_only_on_cuda():
    assert fla_available() == torch.cuda.is_available()


def test_auto_picks_fla_on_cuda_where_it_is_available_and_torch_on_cpu():
    from loong_core.kernels.resolve import resolve_op
    from loong_core.plugins import get_plugin_system
    from loong_core.plugins.registry import Entry, Registry

    entry = get_plugin_system().registry().get("kernel", "gated_delta_rule:fla")
    assert tuple(entry.meta["auto_on"]) == ("cuda",)
    reg = Registry()
    for e in get_plugin_system().registry().entries("kernel"):
        meta = {**e.meta, "available": "loong_kernels.availability:always"} if e is entry else e.meta
        reg.add(Entry(e.kind, e.name, e.target, e.plugin, e.distribution, meta))
    assert resolve_op("gated_delta_rule", "auto", "cuda", reg).backend == "fla"
    assert resolve_op("gated_delta_rule", "auto", "cpu", reg).backend == "torch"
