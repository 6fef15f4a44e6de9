"""Ulysses sequence parallelism on diffusers DiTs, without changing their code or weights.

A family names four places of its model (with :func:`shard_output`, :func:`shard_input`,
:func:`mark_attention` and :func:`pad_output`): where the image / video tokens
first appear (sharded there along the tokens), the positional embedding of those tokens (sharded
alike, so RoPE rotates the local tokens by their global positions), the attention modules whose
attention spans the tokens, and the output projection (zero-padded there to the whole sequence,
before diffusers' parameter-free unpatchify: each rank's loss covers its own tokens only, so
nothing is gathered). The attention modules run with a marker that makes the diffusers
module's ``dispatch_attention_fn`` go through :func:`loong_core.engines.torch_native.ulysses.attention`
(all-to-all between tokens and heads, replicated text tokens first for joint attention); every
other attention call (Wan's cross-attention to the text: local queries, all text keys) is left
as it is. Only forward hooks and instance ``forward`` wrappers are added: parameter names,
state dicts and checkpoints do not change.
"""

from __future__ import annotations

import contextvars
import functools
import sys
from collections.abc import Callable, Iterable

import torch

from loong_core.engines.torch_native import ulysses

# Replicated (text) tokens at the front of the joint sequence inside a marked attention module;
# None outside one.
_TEXT_LEN: contextvars.ContextVar[int | None] = contextvars.ContextVar("ulysses_text_len", default=None)


def _ulysses_dispatch(original: Callable) -> Callable:
    @functools.wraps(original)
    def dispatch(query, key, value, attn_mask=None, *args, **kwargs):
        text_len = _TEXT_LEN.get()
        if text_len is None or ulysses.group() is None:
            return original(query, key, value, attn_mask, *args, **kwargs)
        if attn_mask is not None:
            attn_mask = ulysses.gather_key_mask(attn_mask, text_len)
        return ulysses.attention(query, key, value,
                                 lambda q, k, v: original(q, k, v, attn_mask, *args, **kwargs), text_len)

    dispatch.loong_ulysses = True
    return dispatch


def _route_dispatch(module_name: str) -> None:
    """Make ``module_name.dispatch_attention_fn`` honour the marker (once per module)."""
    namespace = sys.modules[module_name]
    current = namespace.dispatch_attention_fn
    if not getattr(current, "loong_ulysses", False):
        namespace.dispatch_attention_fn = _ulysses_dispatch(current)


def _marked_forward(forward: Callable, text_len: Callable[[tuple, dict], int], *args, **kwargs):
    token = _TEXT_LEN.set(text_len(args, kwargs))
    try:
        return forward(*args, **kwargs)
    finally:
        _TEXT_LEN.reset(token)


def _shard_tensors(value, dim: int, index: int | None):
    if index is None:
        return ulysses.shard(value, dim)
    parts = list(value)
    parts[index] = ulysses.shard(parts[index], dim)
    return type(value)(parts)


def shard_output(module: torch.nn.Module, dim: int, index: int | None = None) -> None:
    """Keep this rank's tokens of ``module``'s output (of element ``index`` of a tuple output)."""
    module.register_forward_hook(lambda _m, _a, out: _shard_tensors(out, dim, index))


def shard_all_outputs(module: torch.nn.Module, dim: int) -> None:
    """Keep this rank's tokens of every tensor of ``module``'s tuple output."""
    module.register_forward_hook(lambda _m, _a, out: type(out)(ulysses.shard(t, dim) for t in out))


def shard_input(module: torch.nn.Module, name: str, position: int = 0, dim: int = 1) -> None:
    """Keep this rank's tokens of ``module``'s input ``name`` (keyword or at ``position``)."""
    def hook(_m, args, kwargs):
        if name in kwargs:
            kwargs[name] = ulysses.shard(kwargs[name], dim)
        else:
            args = (*args[:position], ulysses.shard(args[position], dim), *args[position + 1:])
        return args, kwargs

    module.register_forward_pre_hook(hook, with_kwargs=True)


def pad_output(module: torch.nn.Module, dim: int = 1) -> None:
    """Put this rank's tokens of ``module``'s output at their place in the whole sequence, zeros
    elsewhere (:func:`~loong_core.engines.torch_native.ulysses.pad`: no communication), for a
    loss each rank takes over its own tokens."""
    module.register_forward_hook(lambda _m, _a, out: ulysses.pad(out, dim))


def mark_attention(modules: Iterable[torch.nn.Module], text_len: Callable[[tuple, dict], int]) -> None:
    """Run the attention of ``modules`` sequence-parallel; ``text_len(args, kwargs)`` of a call
    gives its replicated leading tokens (0 for self-attention over the image tokens only)."""
    for module in modules:
        _route_dispatch(type(module.processor).__module__)
        module.forward = functools.partial(_marked_forward, module.forward, text_len)


def no_text(_args, _kwargs) -> int:
    """``text_len`` of a self-attention over the sharded tokens only."""
    return 0
