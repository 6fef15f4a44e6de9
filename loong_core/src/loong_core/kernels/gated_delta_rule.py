"""Torch reference of the gated delta rule (Gated DeltaNet linear attention, Qwen3-Next /
Qwen3.5), chunked, with packed documents.

Per ``(batch, head)`` the state ``S [dk, dv]`` starts at zero and each step ``t`` does::

    S = S * exp(g_t);  u_t = beta_t * (v_t - S^T k_t);  S = S + k_t u_t^T;  o_t = S^T (scale * q_t)

The sequence is cut into chunks of :data:`CHUNK` steps. Inside a chunk, with ``G_t`` the
cumulative log-decay since the chunk start and ``S0`` the state entering it, unrolling the
recurrence gives ``(I + A) U = diag(beta) V - diag(beta e^G) K S0`` with the strictly lower
``A[t, j] = beta_t e^(G_t - G_j) k_t . k_j``. One triangular solve per chunk (the WY / UT
transform, done for all chunks at once) gives ``U = T beta V - W S0``; then the loop over chunks
is three matmuls each::

    U = U0 - W S0;  O = (e^G * Q) S0 + (QK^T * e^(G_t - G_j))_causal U;  S = e^(G_C) S0 + K_dec^T U

Packed documents: a step ``j`` reaches step ``t`` only when no document border lies in
``(j, t]``, and ``S0`` reaches step ``t`` only when none lies between the chunk start and ``t``;
those masks enter the decay factors, so nothing crosses a border (gradients included).

Everything is computed in fp32 (or the input's dtype when wider) and returned in ``q``'s dtype.
Gradients come from autograd; under grad the whole computation runs inside a non-reentrant
``torch.utils.checkpoint``, so the op keeps only its inputs and recomputes the rest in the
backward. Transient memory is ``O(s * (CHUNK + dk + dv) + s / CHUNK * dk * dv)`` per head: never
``[s, s]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

#: Steps per chunk (that of transformers' ``torch_chunk_gated_delta_rule`` and fla).
CHUNK = 64


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, scale: float,
                     segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The gated delta rule over ``[b, s, h, d]`` inputs (see the module docstring).

    Args:
        q, k: ``[b, s, h, dk]``, already L2-normalised and expanded to the ``h`` value heads.
        v: ``[b, s, h, dv]``.
        g: ``[b, s, h]`` log-decay (``<= 0``).
        beta: ``[b, s, h]`` write strength in ``(0, 1)``.
        scale: Applied to ``q`` (callers pass ``dk ** -0.5``).
        segment_ids: Optional ``[b, s]`` ints: the state resets to zero wherever the id changes
            from ``t - 1`` to ``t`` (packed documents).

    Returns:
        ``o [b, s, h, dv]`` in ``q``'s dtype.

    Raises:
        ValueError: inconsistent shapes.
    """
    _check_shapes(q, k, v, g, beta, segment_ids)
    docs = None if segment_ids is None else document_index(segment_ids)
    inputs = (q, k, v, g, beta)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        out = checkpoint(_chunked, *inputs, float(scale), docs, use_reentrant=False)
    else:
        out = _chunked(*inputs, float(scale), docs)
    return out.to(q.dtype)


def document_index(segment_ids: torch.Tensor) -> torch.Tensor:
    """``[b, s]`` int64 index of each position's document within its row: 0 at the start, +1 at
    each position whose id differs from the previous one (so equal ids apart are distinct)."""
    change = (segment_ids[:, 1:] != segment_ids[:, :-1]).long()
    return F.pad(change.cumsum(1), (1, 0))


def _check_shapes(q, k, v, g, beta, segment_ids) -> None:
    b, s, h, _ = q.shape
    problems = []
    if k.shape != q.shape:
        problems.append(f"k {tuple(k.shape)} != q {tuple(q.shape)}")
    if v.dim() != 4 or v.shape[:3] != (b, s, h):
        problems.append(f"v {tuple(v.shape)} is not [{b}, {s}, {h}, dv]")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (b, s, h):
            problems.append(f"{name} {tuple(t.shape)} is not [{b}, {s}, {h}]")
    if segment_ids is not None and segment_ids.shape != (b, s):
        problems.append(f"segment_ids {tuple(segment_ids.shape)} is not [{b}, {s}]")
    if problems:
        raise ValueError(f"gated_delta_rule: {'; '.join(problems)} (q [b, s, h, dk]).")


def _chunks(x: torch.Tensor, n: int, acc: torch.dtype) -> torch.Tensor:
    """``[b, s, h, ...]`` -> contiguous chunk-major ``[n, b, h, CHUNK, ...]`` in ``acc``,
    zero-padded at the end (a chunk is then one contiguous slice, also for autograd)."""
    b, s, h = x.shape[:3]
    pad = [0, 0] * (x.dim() - 2) + [0, n * CHUNK - s]
    x = F.pad(x.to(acc), pad).view(b, n, CHUNK, h, *x.shape[3:])
    return x.permute(1, 0, 3, 2, *range(4, x.dim())).contiguous()


def _masks(docs: torch.Tensor, n: int):
    """Border masks of the document index ``docs [b, s]``, broadcastable over heads.

    Returns:
        ``same [n, b, 1, C, C]`` (steps ``t``, ``j`` of a chunk in one document), ``carry
        [n, b, 1, C]`` (step ``t`` in the document of the step before the chunk) and ``last
        [n, b, 1, C]`` (step ``j`` in the document of the chunk's last step).
    """
    pad = n * CHUNK - docs.shape[1]
    d = torch.cat([docs, docs[:, -1:].expand(-1, pad)], 1).view(-1, n, CHUNK).transpose(0, 1)
    d = d.unsqueeze(2)  # [n, b, 1, C]
    before = torch.cat([d[:1, ..., 0], d[:-1, ..., -1]], 0)  # chunk 0: its own first step
    same = d.unsqueeze(-1) == d.unsqueeze(-2)
    return same, d == before.unsqueeze(-1), d == d[..., -1:]


def _chunked(q, k, v, g, beta, scale: float, docs):
    b, s, h, dk = q.shape
    dv = v.shape[-1]
    acc = torch.promote_types(q.dtype, torch.float32)
    n = -(-s // CHUNK)
    q, k, v = (_chunks(x, n, acc) for x in (q, k, v))  # [n, b, h, C, d]
    g, beta = _chunks(g, n, acc), _chunks(beta, n, acc)  # [n, b, h, C]
    q = q * scale

    cum = g.cumsum(-1)  # log-decay from the chunk start through each step
    reach = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    from_start = cum.exp()  # how much of S0 reaches each step
    to_end = (cum[..., -1:] - cum).exp()  # how much of each step's write reaches the chunk end
    if docs is not None:
        same, carry, last = _masks(docs, n)
        reach = reach & same
        from_start, to_end = from_start * carry, to_end * last
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~reach, float("-inf")).exp()
    end_decay = from_start[..., -1, None, None]

    # WY / UT transform of every chunk at once: (I + A)^-1 [beta V | beta e^G K].
    a = (k @ k.transpose(-1, -2)) * decay * beta.unsqueeze(-1)
    rhs = torch.cat([v * beta.unsqueeze(-1), k * (beta * from_start).unsqueeze(-1)], -1)
    sol = torch.linalg.solve_triangular(a.tril(-1), rhs, upper=False, unitriangular=True)
    u0, w = sol[..., :dv], sol[..., dv:]
    attn = (q @ k.transpose(-1, -2)) * decay
    q_start = q * from_start.unsqueeze(-1)
    k_end = (k * to_end.unsqueeze(-1)).transpose(-1, -2)

    state = q.new_zeros(b, h, dk, dv)
    outs = []
    for u0_i, w_i, attn_i, q_i, k_i, decay_i in zip(*(t.unbind(0) for t in (
            u0, w, attn, q_start, k_end, end_decay))):
        u = u0_i - w_i @ state
        outs.append(q_i @ state + attn_i @ u)
        state = state * decay_i + k_i @ u
    o = torch.stack(outs, 1).transpose(2, 3).reshape(b, n * CHUNK, h, dv)  # [b, n, C, h, dv]
    return o[:, :s]
