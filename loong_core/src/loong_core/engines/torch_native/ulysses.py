"""Ulysses sequence parallelism for the torch engine (``parallel.ulysses_size=N``).

The ``N`` ranks of one Ulysses group read the same micro batch; each keeps ``1/N`` of the sequence
(image / video tokens) through the whole model. Around every attention an all-to-all turns
``[b, s/N, h, d]`` into ``[b, s, h/N, d]`` (all tokens, a slice of the heads), the attention runs
on complete sequences, and the reverse all-to-all brings the output back to ``[b, s/N, h, d]``.

Gradient convention (what makes the pieces compose): every collective here is paired with its
exact adjoint (all-to-all <-> reverse all-to-all, all-gather <-> reduce-scatter, slicing <->
zero padding). A tensor computed identically on every rank of the group ("replicated": the
timestep embedding, text tokens) therefore carries on each rank only the part of its gradient
that flows through that rank's tokens or heads, and the sum over the group is the one-rank
gradient. The same holds for the parameters, whose gradients the data-parallel reduction sums
over all ranks anyway; a model's per-rank loss must then be its share of the loss, so that the
shares sum to the one-rank loss.

The loss needs no gather: the output projection's tokens are zero-padded to the whole sequence
(:func:`pad`: no communication; backward: this rank's slice), so the parameter-free unpatchify
runs as on one rank, and a per-token loss (the flow-matching MSE) taken over this rank's own
tokens is this rank's share; quantities computed identically on every rank (a sample count)
contribute :func:`loss_share`.

Text tokens of joint attention (MMDiT) are replicated: they are short, so every rank keeps all of
them; :func:`attention` gives each rank the heads it owns of them, and gathers the text output
heads back (all-gather, backward reduce-scatter).

The group is set once by the engine (:func:`set_group`); without one (``ulysses_size=1``, one
process, ``loong sample``) every function here is the identity.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from loong_core.engines.sequence_collectives import GatherSequence
from loong_core.errors import ConfigError

_GROUP = None


def set_group(group) -> None:
    """Make ``group`` (a process group of size > 1, or None) the Ulysses group of this process."""
    global _GROUP
    _GROUP = group if group is not None and group.size() > 1 else None


def group():
    """The Ulysses process group, or None when sequence parallelism is off."""
    return _GROUP


def size() -> int:
    """Ranks in the Ulysses group (1 when off)."""
    return _GROUP.size() if _GROUP is not None else 1


def rank() -> int:
    """This rank's index in the Ulysses group (0 when off)."""
    return dist.get_rank(_GROUP) if _GROUP is not None else 0


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, grp) -> torch.Tensor:
    n = grp.size()
    send = torch.stack(x.chunk(n, dim=scatter_dim)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=grp)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class AllToAll(torch.autograd.Function):
    """Split ``x`` along ``scatter_dim`` over the group, concatenate the received pieces along
    ``gather_dim`` in rank order; backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scatter_dim: int, gather_dim: int, grp) -> torch.Tensor:
        ctx.dims, ctx.group = (scatter_dim, gather_dim), grp
        return _all_to_all(x, scatter_dim, gather_dim, grp)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def _divisible(length: int, what: str) -> None:
    n = size()
    if length % n:
        raise ConfigError(
            f"parallel.ulysses_size={n} does not divide the {length} {what} of this batch; use "
            f"inputs (latent frames / height / width over the patch size) whose {what} are a "
            f"multiple of {n}.")


def shard(x: torch.Tensor, dim: int = 1, what: str = "tokens") -> torch.Tensor:
    """This rank's contiguous ``1/N`` of ``x`` along ``dim`` (backward: zero padding)."""
    if _GROUP is None:
        return x
    _divisible(x.shape[dim], what)
    return x.chunk(size(), dim=dim)[rank()].contiguous()


def gather(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """All ranks' ``x`` concatenated along ``dim`` in rank order (backward: reduce-scatter)."""
    if _GROUP is None:
        return x
    return GatherSequence.apply(x.movedim(dim, 0), _GROUP).movedim(0, dim).contiguous()


def pad(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """This rank's tokens ``x`` (its contiguous ``1/N`` along ``dim``) at their place in the whole
    sequence, zeros at the other ranks' (no communication; backward: this rank's slice of the
    gradient). The adjoint of :func:`shard`."""
    if _GROUP is None:
        return x
    n, r = size(), rank()
    shape = list(x.shape)
    before, after = list(shape), list(shape)
    before[dim], after[dim] = r * shape[dim], (n - 1 - r) * shape[dim]
    return torch.cat([x.new_zeros(before), x, x.new_zeros(after)], dim=dim)


def seq_to_heads(x: torch.Tensor) -> torch.Tensor:
    """``[b, s/N, h, d]`` -> ``[b, s, h/N, d]``."""
    if _GROUP is None:
        return x
    _divisible(x.shape[2], "attention heads")
    return AllToAll.apply(x, 2, 1, _GROUP)


def heads_to_seq(x: torch.Tensor) -> torch.Tensor:
    """``[b, s, h/N, d]`` -> ``[b, s/N, h, d]`` (inverse of :func:`seq_to_heads`)."""
    if _GROUP is None:
        return x
    return AllToAll.apply(x, 1, 2, _GROUP)


def gather_key_mask(mask: torch.Tensor, text_len: int = 0) -> torch.Tensor:
    """A key mask ``[..., text_len + s/N]`` (replicated text keys first) -> ``[..., text_len + s]``."""
    if _GROUP is None:
        return mask
    text, local = mask[..., :text_len], mask[..., text_len:].contiguous()
    pieces = [torch.empty_like(local) for _ in range(size())]
    if local.dtype == torch.bool:  # gloo has no bool collectives
        as_bytes = [p.to(torch.uint8) for p in pieces]
        dist.all_gather(as_bytes, local.to(torch.uint8), group=_GROUP)
        pieces = [p.bool() for p in as_bytes]
    else:
        dist.all_gather(pieces, local, group=_GROUP)
    return torch.cat([text, *pieces], dim=-1)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attend, text_len: int = 0):
    """Sequence-parallel attention in ``[b, s, h, d]`` layout.

    Args:
        query: ``[b, text_len + s/N, h, d]``: ``text_len`` replicated (text) tokens first, then
            this rank's tokens; key and value alike (key and value may have other head counts
            only if each is divisible by ``N``).
        key: Keys, same layout.
        value: Values, same layout.
        attend: ``attend(q, k, v) -> out`` on complete sequences ``[b, text_len + s, h/N, d]``.
        text_len: Replicated tokens at the front (0: every token is sharded).

    Returns:
        ``[b, text_len + s/N, h, d]`` in the layout of ``query``.
    """
    if _GROUP is None:
        return attend(query, key, value)
    heads, r = size(), rank()

    def split(x):
        text, local = x[:, :text_len], x[:, text_len:]
        full = seq_to_heads(local)
        if not text_len:
            return full
        return torch.cat([text.chunk(heads, dim=2)[r], full], dim=1)

    out = attend(split(query), split(key), split(value))
    local = heads_to_seq(out[:, text_len:])
    if not text_len:
        return local
    return torch.cat([gather(out[:, :text_len], dim=2), local], dim=1)


def loss_share(value):
    """This rank's share of a loss (or count) computed identically on every rank of the group."""
    return value / size() if _GROUP is not None else value

