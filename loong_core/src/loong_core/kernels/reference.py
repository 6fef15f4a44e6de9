"""Torch references of the kernel seam's ops: the ``torch`` backend and the semantics every other
backend (``compile``, ``triton``, ``chunked``, ...) reproduces.

Every function is differentiable with plain autograd, returns the dtype it gets (losses are fp32)
and is registered as ``"<op>:torch"`` by ``loong_core.builtin``. A backend registered for an op
takes exactly the same arguments.

The attention reference (``attention:eager``) materialises the scores; the fast attention
backends are in :mod:`loong_core.kernels.attention`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMS-normalise ``x`` over its last dim and scale by ``weight``.

    Computed in fp32 and cast back to ``x.dtype``.

    Args:
        x: ``[..., d]``.
        weight: ``[d]``.
        eps: Added to the mean square.
        residual: Optional ``[..., d]``; then ``h = x + residual`` is normalised.

    Returns:
        ``norm(x)``, or ``(norm(h), h)`` with ``residual`` (``h`` in ``x.dtype``).
    """
    h = x if residual is None else x + residual
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    out = (y * weight.float()).to(x.dtype)
    return out if residual is None else (out, h)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU of megatron-core's gated fc1 output.

    Args:
        x: ``[..., 2F]``: ``x[..., :F]`` is the gate, ``x[..., F:]`` the up projection.

    Returns:
        ``silu(gate) * up``, ``[..., F]``.
    """
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, megatron-core layout, non-interleaved (rotate-half).

    Args:
        t: ``[s, b, h, d]``.
        freqs: ``[s, b or 1, 1, d_rot]`` fp32 angles as megatron-core's ``RotaryEmbedding`` /
            ``MultimodalRotaryEmbedding`` produce them (standard, llama3-scaled and MRoPE differ
            only in these angles); ``d_rot <= d``.

    Returns:
        ``t`` with its first ``d_rot`` channels rotated and the rest passed through.
    """
    rot_dim = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    cos = torch.cos(freqs).to(t.dtype)
    sin = torch.sin(freqs).to(t.dtype)
    t_rot = (t_rot * cos) + (_rotate_half(t_rot) * sin)
    return torch.cat((t_rot, t_pass), dim=-1)


def layer_norm_modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                        weight: torch.Tensor | None = None, bias: torch.Tensor | None = None):
    """LayerNorm over the last dim, then adaLN modulation ``* (1 + scale) + shift``.

    Args:
        x: ``[b, s, d]``.
        shift: ``[b, 1, d]`` or ``[b, s, d]``.
        scale: Same shape as ``shift``.
        eps: LayerNorm epsilon.
        weight: Optional LayerNorm weight ``[d]``.
        bias: Optional LayerNorm bias ``[d]``.

    Returns:
        ``[b, s, d]`` in ``x.dtype`` (computed in fp32).
    """
    y = F.layer_norm(x.float(), (x.shape[-1],), None if weight is None else weight.float(),
                     None if bias is None else bias.float(), eps)
    return (y * (1 + scale.float()) + shift.float()).to(x.dtype)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0,
                  group=None) -> torch.Tensor:
    """Per-token cross entropy with megatron-core's ``vocab_parallel_cross_entropy`` semantics.

    Args:
        logits: ``[..., V_local]``: this rank's contiguous shard of the vocabulary (rank ``r`` of
            ``group`` holds ids ``[r * V_local, (r + 1) * V_local)``); the whole vocabulary when
            ``group`` is None.
        labels: ``[...]`` global token ids.
        label_smoothing: In ``[0, 1)``. As in megatron-core, the smoothing term uses this rank's
            shard (``V_local`` and the mean log-probability over the shard).
        group: The tensor-parallel process group (megatron-core's, the only one its function
            reduces over), or None.

    Returns:
        fp32 loss ``[...]``. The gradient of ``logits`` is this shard's (softmax - one-hot).
    """
    if group is not None:
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        if group is not parallel_state.get_tensor_model_parallel_group():
            raise ValueError("cross_entropy: group must be megatron-core's tensor-parallel group.")
        return vocab_parallel_cross_entropy(logits, labels, label_smoothing)
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    loss = lse - x.gather(-1, labels.unsqueeze(-1).long()).squeeze(-1)
    if label_smoothing > 0:
        vocab = x.shape[-1]
        smoothing = label_smoothing * vocab / (vocab - 1)
        mean_log_probs = (x - lse.unsqueeze(-1)).mean(dim=-1)
        loss = (1.0 - smoothing) * loss - smoothing * mean_log_probs
    return loss


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         label_smoothing: float = 0.0, group=None) -> torch.Tensor:
    """Cross entropy of the output projection: ``cross_entropy(hidden @ weight.T, labels, ...)``.

    The reference materialises the ``[N, V_local]`` logits; other backends must not.

    Args:
        hidden: ``[N, H]`` final hidden states (already gathered over the sequence-parallel
            region).
        weight: ``[V_local, H]`` output-layer (or tied embedding) shard.
        labels: ``[N]`` global token ids.
        label_smoothing: As in :func:`cross_entropy`.
        group: As in :func:`cross_entropy`.

    Returns:
        fp32 loss ``[N]``. Gradients flow to ``hidden`` and ``weight``; under tensor parallelism
        the gradient of ``hidden`` is this rank's partial sum (the caller all-reduces it over
        ``group``, as megatron-core's ``copy_to_tensor_model_parallel_region`` does).
    """
    return cross_entropy(hidden @ weight.t(), labels, label_smoothing, group)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
              segment_ids: torch.Tensor | None = None, mask: torch.Tensor | None = None,
              scale: float | None = None, dropout_p: float = 0.0,
              kv_segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention that materialises the ``[b, h, sq, sk]`` scores (backend ``eager``).

    Args:
        q: ``[b, hq, sq, d]``.
        k: ``[b, hk, sk, d]``, ``hq`` a multiple of ``hk`` (grouped-query attention).
        v: ``[b, hk, sk, dv]``.
        causal: Query ``i`` attends keys ``j <= i + (sk - sq)``: with ``sq < sk`` the query
            block is aligned to the END of the keys (bottom-right causal: the queries are the
            last ``sq`` positions of the key sequence, as a context-parallel chunk against its
            key prefix or a later chunk against the keys of earlier chunks and its own).
        segment_ids: Optional ``[b, sq]`` ints, the segment of each query: a query attends only
            keys with the same id (packed documents, vision windows). Combined with ``causal``.
        mask: Optional boolean ``[b or 1, 1 or hq, sq, sk]``, True = may attend, for patterns
            the two above do not describe. Combined with both.
        scale: Softmax scale (default ``d ** -0.5``).
        dropout_p: Dropout on the probabilities.
        kv_segment_ids: Optional ``[b, sk]`` ints, the segment of each key (needs
            ``segment_ids``); default ``segment_ids`` (then ``sq == sk``). With ``sq < sk`` and
            the same tokens, ``segment_ids == kv_segment_ids[:, sk - sq:]``.

    Returns:
        ``[b, hq, sq, dv]`` in ``q.dtype``; a query that may attend no key gives zeros.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    allowed = combined_mask(q.shape[2], k.shape[2], q.device, causal, segment_ids, mask,
                            kv_segment_ids)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if dropout_p > 0:
        probs = F.dropout(probs, dropout_p)
    return torch.matmul(probs.to(v.dtype), v)


def combined_mask(sq: int, sk: int, device, causal: bool, segment_ids, mask, kv_segment_ids=None):
    """The dense boolean mask (True = attend) that ``causal`` / ``segment_ids`` / ``mask`` /
    ``kv_segment_ids`` describe (see :func:`attention`), broadcastable to ``[b, h, sq, sk]``;
    None when everything may attend.

    Raises:
        ValueError: ``kv_segment_ids`` without ``segment_ids``, or ids of the wrong length.
    """
    allowed = None
    if causal:
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=device).tril(sk - sq)
    if segment_ids is not None or kv_segment_ids is not None:
        q_ids, k_ids = check_segment_ids(sq, sk, segment_ids, kv_segment_ids)
        same = q_ids[:, None, :, None] == k_ids[:, None, None, :]
        allowed = same if allowed is None else same & allowed
    if mask is not None:
        allowed = mask if allowed is None else mask & allowed
    return allowed


def check_segment_ids(sq: int, sk: int, segment_ids, kv_segment_ids):
    """The query and key segment ids of an attention call (``kv_segment_ids`` defaults to
    ``segment_ids``).

    Raises:
        ValueError: ``kv_segment_ids`` without ``segment_ids``, or ids whose length is not
            ``sq`` / ``sk``.
    """
    if segment_ids is None:
        raise ValueError("attention: kv_segment_ids needs segment_ids (the queries' segments).")
    kv = segment_ids if kv_segment_ids is None else kv_segment_ids
    if segment_ids.shape[-1] != sq or kv.shape[-1] != sk:
        raise ValueError(f"attention: segment_ids of length {segment_ids.shape[-1]} and key segment "
                         f"ids of length {kv.shape[-1]} for {sq} queries and {sk} keys; pass "
                         "kv_segment_ids [b, sk] when the keys are not the queries' tokens.")
    return segment_ids, kv


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """DeepSeek sparse attention: each query over the keys ``indices [b, s, topk]`` selects
    (``q, k [s, b, h, d]``, ``v [s, b, h, dv]`` -> ``[s, b, h, dv]``); chunked, no ``[s, s]``
    matrix (:mod:`loong_core.kernels.sparse_attention`)."""
    from loong_core.kernels import sparse_attention as dsa

    return dsa.sparse_attention(q, k, v, indices, scale)


def indexer_topk(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, topk: int) -> torch.Tensor:
    """The lightning indexer's causal top-k keys ``[b, s, min(topk, s)]`` of ``q [s, b, H, D]``,
    ``k [s, b, D]``, ``w [s, b, H]`` (:mod:`loong_core.kernels.sparse_attention`)."""
    from loong_core.kernels import sparse_attention as dsa

    return dsa.indexer_topk(q, k, w, topk)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, scale: float,
                     segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Gated DeltaNet linear attention: per ``(b, h)`` a state ``S [dk, dv]`` from zero, per step
    ``S = S * exp(g_t)``, ``S += k_t (beta_t (v_t - S^T k_t))^T``, ``o_t = S^T (scale q_t)``, reset
    where ``segment_ids [b, s]`` changes (``q, k [b, s, h, dk]``, ``v [b, s, h, dv]``, ``g, beta
    [b, s, h]`` -> ``[b, s, h, dv]``); chunked, fp32 (:mod:`loong_core.kernels.gated_delta_rule`)."""
    from loong_core.kernels import gated_delta_rule as gdr

    return gdr.gated_delta_rule(q, k, v, g, beta, scale, segment_ids)
