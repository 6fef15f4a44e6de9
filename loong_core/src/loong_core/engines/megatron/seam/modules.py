"""megatron-core modules backed by the kernel seam (``loong_core.kernels.get``)."""

from __future__ import annotations

import weakref

import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule

from loong_core import kernels
from loong_core.engines.megatron.seam import chunked_attention, context_parallel, swiglu
from loong_core.errors import ConfigError
from loong_core.kernels.segment_mask import BlockDiagonalMask, SegmentMask, segment_mask


class SeamRMSNorm(torch.nn.Module):
    """RMSNorm through ``kernels.get("rms_norm")``; same parameter (``weight``) as the
    ``torch.nn.RMSNorm`` megatron-core's local spec builds, so checkpoints are interchangeable.

    Takes megatron-core's norm constructor arguments.
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "RMSNorm"):
        super().__init__()
        if config.normalization != "RMSNorm" or config.layernorm_zero_centered_gamma:
            raise ConfigError("SeamRMSNorm serves normalization=RMSNorm without zero-centred gamma.")
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.get("rms_norm")(x, self.weight, self.eps)


class SeamSwiGLU(torch.nn.Module):
    """The gated MLP activation (``silu(gate) * up`` of fc1's ``[gate; up]``) through
    ``kernels.get("swiglu")`` (the plain ``torch`` backend: :mod:`.swiglu`, megatron-core's
    own math); megatron-core's ``MLP`` calls it on the whole fc1 output when
    ``config.use_te_activation_func`` is set (see :func:`..spec.transformer_kwargs`)."""

    def __init__(self, config=None):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if kernels.is_plain("swiglu"):
            return swiglu.apply(x)
        return kernels.get("swiglu")(x)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata=None) -> dict:
        """Nothing to save: the activation has no parameters (megatron-core's ``MLP`` asks every
        child for its sharded state when it checkpoints)."""
        return {}


_segments_cache: dict[str, tuple] = {}


def mask_to_pattern(attention_mask: torch.Tensor):
    """Describe megatron's boolean mask (True = masked, ``[b or 1, 1, sq, sk]``) for the seam.

    Block-diagonal masks, causal inside each block (packed documents) or not (vision windows and
    frames), become ``segment_ids`` so the varlen paths run and no dense mask is needed; other
    masks are passed on densely. A mask replaces the causal pattern of the mask type, as in
    megatron-core's ``DotProductAttention``. The check runs over blocks of rows (no second
    ``[s, s]`` tensor) and its result is cached per mask tensor (every layer of a forward gets
    the same one).

    Returns:
        ``(causal, segment_ids [b, s] or None, allowed mask [b, 1, sq, sk] or None)``.
    """
    cached = _segments_cache.get("last")
    if cached is not None and cached[0]() is attention_mask:
        return cached[1]
    masked = attention_mask.reshape(attention_mask.shape[0], *attention_mask.shape[-2:])
    sq, sk = masked.shape[-2:]
    result = None
    if sq == sk:
        rows = range(0, sq, _ROWS)
        # The first key each query may see names its segment.
        segment_ids = torch.cat([(~masked[:, r:r + _ROWS]).to(torch.int8).argmax(dim=-1) for r in rows], 1)
        keys = torch.arange(sk, device=masked.device)
        for causal in (True, False):
            if all(_block_rows_match(masked, segment_ids, keys, r, causal) for r in rows):
                result = (causal, segment_ids, None)
                break
    if result is None:
        result = (False, None, ~masked.unsqueeze(1))
    _segments_cache["last"] = (weakref.ref(attention_mask), result)
    return result


_ROWS = 512


def _block_rows_match(masked, segment_ids, keys, r: int, causal: bool) -> bool:
    """Rows ``r : r + _ROWS`` of ``masked`` are exactly "other segment (or a later key)"."""
    seg = segment_ids[:, r:r + _ROWS]
    expected = seg[:, :, None] != segment_ids[:, None, :]
    if causal:
        expected = expected | (keys[None, None, :] > keys[r:r + seg.shape[1], None][None])
    return torch.equal(expected, masked[:, r:r + _ROWS])


def thd_segment_mask(packed_seq_params, tokens: int, device) -> SegmentMask:
    """The :class:`SegmentMask` ``[1, t]`` of megatron-core's THD ``PackedSeqParams``: one
    segment per ``cu_seqlens`` interval (tokens after the last one form one more).

    Raises:
        NotImplementedError: Not the THD format, different query and key documents, or padded
            ``cu_seqlens`` that differ from the unpadded ones.
    """
    p = packed_seq_params
    if p.qkv_format != "thd":
        raise NotImplementedError(f"SeamCoreAttention: packed_seq_params.qkv_format={p.qkv_format!r} "
                                  "(only 'thd' is supported).")
    cu = p.cu_seqlens_q
    for other in (p.cu_seqlens_kv, p.cu_seqlens_q_padded, p.cu_seqlens_kv_padded):
        if other is not None and not torch.equal(other, cu):
            raise NotImplementedError("SeamCoreAttention: THD packed_seq_params whose query / key / "
                                      "padded cu_seqlens differ (self-attention over unpadded "
                                      "documents only).")
    lengths = torch.diff(cu.to(device=device, dtype=torch.int64))
    rest = tokens - int(cu[-1])
    if rest < 0:
        raise ValueError(f"SeamCoreAttention: cu_seqlens end at {int(cu[-1])} > {tokens} tokens.")
    lengths = torch.cat([lengths, lengths.new_tensor([rest])])
    ids = torch.repeat_interleave(torch.arange(len(lengths), device=device, dtype=torch.int32), lengths)
    return segment_mask(ids[None])


class SeamCoreAttention(MegatronModule):
    """Core attention through ``kernels.get("attention")`` (``sdpa`` / ``flex`` / ``eager``).

    A drop-in for megatron-core's local ``DotProductAttention`` (same constructor and forward
    arguments), also for MLA (``k_channels`` / ``v_channels`` differ). Query ``[sq, b, np, hn]``,
    key ``[sk, b, ng, hn]``, value ``[sk, b, ng, hv]`` with ``np`` a multiple of ``ng`` (GQA:
    K/V are not repeated); returns ``[sq, b, np * hv]``. ``attention_mask`` is None (the mask
    type's pattern), a :class:`~loong_core.kernels.segment_mask.SegmentMask` (packed documents
    as segment ids: no ``[s, s]`` mask exists), a
    :class:`~loong_core.kernels.segment_mask.BlockDiagonalMask` (vision windows and frames as
    group ids, attended both ways) or megatron's boolean mask. Under context parallelism
    (``context_parallel_size > 1``) the keys and values of the group are all-gathered
    (:mod:`.context_parallel`); a ``SegmentMask`` then holds the ids of the whole sequence (the
    batch's, unsliced) and a dense mask is not supported.
    """

    def __init__(self, config, layer_number, attn_mask_type, attention_type="self",
                 attention_dropout=None, softmax_scale=None, k_channels=None, v_channels=None,
                 cp_comm_type=None, pg_collection=None, **kwargs):
        super().__init__(config=config)
        unsupported = {
            "apply_query_key_layer_scaling": config.apply_query_key_layer_scaling,
            "window_size": config.window_size is not None,
            f"softmax_type={config.softmax_type}": config.softmax_type != "vanilla",
        }
        bad = [name for name, on in unsupported.items() if on]
        if bad:
            raise ConfigError(f"kernels.attention does not support {', '.join(bad)} "
                              f"(megatron-core's TransformerEngine attention does).")
        self.attn_mask_type = attn_mask_type
        head_dim = k_channels or config.kv_channels
        self.softmax_scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.cp_group = None
        if config.context_parallel_size > 1:
            cp = getattr(pg_collection, "cp", None) if pg_collection is not None else None
            if cp is None:
                from megatron.core import parallel_state

                cp = parallel_state.get_context_parallel_group()
            self.cp_group = cp

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        if attention_bias is not None:
            raise NotImplementedError("SeamCoreAttention: an attention bias (megatron-core's "
                                      "TransformerEngine attention takes one).")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if chunked_attention.active() is not None:  # parallel.sequence_chunks > 1
            if (packed_seq_params is not None or attention_mask is not None
                    or mask_type != AttnMaskType.causal):
                raise NotImplementedError("SeamCoreAttention: parallel.sequence_chunks > 1 needs "
                                          "causal attention without a dense mask or THD "
                                          "packed_seq_params (packed documents come as segment ids).")
            out = chunked_attention.attention(
                self, query, key, value, cp_group=self.cp_group, scale=self.softmax_scale,
                dropout_p=self.dropout if self.training else 0.0)
            return out.reshape(query.shape[0], query.shape[1], -1)
        if packed_seq_params is not None:  # THD: [t, np, hn], documents by cu_seqlens
            if self.cp_group is not None or attention_mask is not None:
                raise NotImplementedError("SeamCoreAttention: THD packed_seq_params with context "
                                          "parallelism or an attention mask.")
            attention_mask = thd_segment_mask(packed_seq_params, query.shape[0], query.device)
            query, key, value = (t.unsqueeze(1) for t in (query, key, value))
            if mask_type != AttnMaskType.causal:
                raise NotImplementedError("SeamCoreAttention: THD packed_seq_params without a causal "
                                          "mask type.")
        if self.cp_group is not None:
            causal, segment_ids = mask_type == AttnMaskType.causal, None
            if isinstance(attention_mask, SegmentMask):  # packed: the whole sequence's ids
                causal, segment_ids = True, attention_mask.segment_ids()
            elif attention_mask is not None:
                raise NotImplementedError("SeamCoreAttention: a dense attention mask under context "
                                          "parallelism; pass packed documents as a SegmentMask of the "
                                          "whole sequence (segment_mask.with_attention_mask).")
            out = context_parallel.attention(
                query, key, value, self.cp_group, causal=causal, segment_ids=segment_ids,
                scale=self.softmax_scale, dropout_p=self.dropout if self.training else 0.0)
            return out.reshape(query.shape[0], query.shape[1], -1)
        segment_ids = mask = None
        if attention_mask is None:
            causal = mask_type == AttnMaskType.causal
        elif isinstance(attention_mask, SegmentMask):  # packed documents, as the data gives them
            causal, segment_ids = True, attention_mask.segment_ids()
        elif isinstance(attention_mask, BlockDiagonalMask):  # vision windows / frames, both ways
            causal, segment_ids = False, attention_mask.segment_ids()
        else:
            causal, segment_ids, mask = mask_to_pattern(attention_mask)
        b = query.shape[1]
        if segment_ids is not None and segment_ids.shape[0] != b:
            segment_ids = segment_ids.expand(b, -1)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, n, s, d]
        out = kernels.get("attention")(
            q, k, v, causal=causal, segment_ids=segment_ids, mask=mask, scale=self.softmax_scale,
            dropout_p=self.dropout if self.training else 0.0)
        return out.permute(2, 0, 1, 3).reshape(query.shape[0], b, -1)
