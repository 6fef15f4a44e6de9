"""The spec seam: megatron-core layer specs whose norm, activation and attention come from the
kernel seam, for every family (LLM decoders, MoE, MLA, VLM foundations and vision encoders).

A family builds its spec as usual (``get_gpt_layer_local_spec``, ``get_gpt_decoder_block_spec``,
its own ``ModuleSpec``) and passes it through :func:`apply`; its ``TransformerConfig`` takes
:func:`transformer_kwargs`. :class:`LoongSpecProvider` is the same choice as a megatron-core
``BackendSpecProvider`` for code that builds specs from a provider.
"""

from __future__ import annotations

import dataclasses
import logging

from megatron.core.models.backends import LocalSpecProvider
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm

from loong_core import kernels
from loong_core.engines.megatron.seam import logits_max, rope, swiglu
from loong_core.engines.megatron.seam.modules import SeamCoreAttention, SeamRMSNorm, SeamSwiGLU

logger = logging.getLogger(__name__)

# Core-attention classes the seam replaces (a family's own local attention registers here).
CORE_ATTENTION = {DotProductAttention}


class LoongSpecProvider(LocalSpecProvider):
    """megatron-core's local modules, with the kernel seam's wherever an op is not plain.

    Core attention is always the seam's (``kernels.attention``); norms are the seam's when
    ``kernels.rms_norm`` resolves to a backend other than ``torch`` (the plain path keeps
    megatron-core's own norm); the SwiGLU activation is always the seam's (with ``torch``:
    :mod:`.swiglu`, megatron-core's math bit for bit with one copy fewer per layer).
    """

    def layer_norm(self, rms_norm: bool = False, for_qk: bool = False) -> type:
        if rms_norm and not kernels.is_plain("rms_norm"):
            return SeamRMSNorm
        return super().layer_norm(rms_norm=rms_norm, for_qk=for_qk)

    def core_attention(self) -> type:
        return SeamCoreAttention

    def activation_func(self) -> type | None:
        return SeamSwiGLU


def swiglu_active(config) -> bool:
    """The seam's SwiGLU module runs for this config: a gated silu MLP (with the plain
    ``kernels.swiglu``: one :mod:`.swiglu` reproduces, no clamp or linear offset)."""
    import torch

    gated_silu = (bool(config.gated_linear_unit)
                  and config.activation_func is torch.nn.functional.silu)
    return gated_silu and (not kernels.is_plain("swiglu") or swiglu.covers(config))


def transformer_kwargs(gated_silu: bool = True) -> dict:
    """``TransformerConfig`` fields that go with :func:`apply` (``use_te_activation_func`` makes
    megatron-core's MLP call the activation module, :class:`SeamSwiGLU`, on the whole fc1
    output)."""
    return {"use_te_activation_func": gated_silu}


def apply(spec, config=None, vp_stage: int | None = None):
    """Return ``spec`` (a layer spec, a block spec or any ``ModuleSpec`` tree) with the seam's
    modules; the input is not modified.

    A single layer's spec becomes the block's submodules (``vp_stage`` picks the layers of a
    virtual pipeline stage), so the block's final norm is the seam's too. Every core attention
    in :data:`CORE_ATTENTION` becomes :class:`SeamCoreAttention`; with a
    non-plain ``rms_norm`` every RMSNorm (``WrappedTorchNorm`` under ``normalization=RMSNorm``)
    becomes :class:`SeamRMSNorm`; with ``config.use_te_activation_func`` every MLP gets
    :class:`SeamSwiGLU`. Also routes megatron-core's rotary embedding through the seam and
    gives its cross entropy the cheaper row maximum of :mod:`.logits_max`.
    Without ``config`` (a spec built before its ``TransformerConfig``) only the core attention
    and RoPE are the seam's and a layer spec stays a layer spec.
    """
    import copy

    from megatron.core.transformer.transformer_block import _get_block_submodules
    from megatron.core.transformer.transformer_layer import BaseTransformerLayer

    rope.install()
    logits_max.install()
    spec = copy.deepcopy(spec)
    norm, act = WrappedTorchNorm, None
    if config is not None:
        if isinstance(spec, ModuleSpec) and issubclass(spec.module, BaseTransformerLayer):
            spec = _get_block_submodules(config, spec, vp_stage)
        if config.normalization == "RMSNorm":
            norm = LoongSpecProvider().layer_norm(rms_norm=True)
        if config.use_te_activation_func:
            if not swiglu_active(config):
                raise ValueError("use_te_activation_func is set but the MLP is not a gated silu.")
            act = SeamSwiGLU
    _walk(spec, norm, act, set())
    return spec


def _swap(value, norm, act):
    if value in CORE_ATTENTION:
        return SeamCoreAttention
    if value is WrappedTorchNorm and norm is not WrappedTorchNorm:
        return norm
    return value


def _walk(node, norm, act, seen: set) -> None:
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, ModuleSpec):
        node.module = _swap(node.module, norm, act)
        if node.submodules is not None:
            _walk(node.submodules, norm, act, seen)
        return
    if isinstance(node, (list, tuple)):
        for item in node:
            _walk(item, norm, act, seen)
        return
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        if isinstance(node, MLPSubmodules) and act is not None:
            node.activation_func = act
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if isinstance(value, type):
                setattr(node, f.name, _swap(value, norm, act))
            else:
                _walk(value, norm, act, seen)
