"""``parallel.mixed_precision`` on the megatron engine, with megatron-core's own machinery.

bf16 / fp16 runs keep the model's parameters in that dtype (megatron-core's ``Float16Module``
wrapper, ``TransformerConfig(bf16=..., fp16=..., params_dtype=...)``); the mixed-precision
optimizer (``Float16OptimizerWithFloat16Params``, or the ``DistributedOptimizer``) owns fp32 main
parameters, fp32 main gradients and fp32 Adam state, and fp16 scales the loss (dynamically by
default) with Megatron's ``loss_scale`` / ``initial_loss_scale`` / ``min_loss_scale`` /
``loss_scale_window`` / ``hysteresis``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve(choice: str, device) -> str:
    """``fp32`` / ``bf16`` / ``fp16`` for ``parallel.mixed_precision`` on ``device``
    (``auto``: bf16 where the backend's ``fast_bf16`` says so, fp32 elsewhere)."""
    if choice == "auto":
        return "bf16" if getattr(device, "fast_bf16", False) else "fp32"
    return choice


@dataclass(frozen=True)
class Precision:
    """The resolved precision of a megatron-engine run.

    Attributes:
        name: ``fp32``, ``bf16`` or ``fp16``.
        grads_in_fp32: Gradients accumulate and are reduced in fp32 buffers.
    """

    name: str
    grads_in_fp32: bool = True

    @property
    def mixed(self) -> bool:
        """Parameters in a 16-bit dtype with fp32 main copies in the optimizer."""
        return self.name != "fp32"

    @property
    def params_dtype(self) -> torch.dtype:
        """Dtype of the model's parameters (and of pipeline messages)."""
        return _DTYPES[self.name]

    def transformer_kwargs(self) -> dict:
        """``TransformerConfig`` fields."""
        return {"fp16": self.name == "fp16", "bf16": self.name == "bf16",
                "params_dtype": self.params_dtype, "pipeline_dtype": self.params_dtype}

    def ddp_kwargs(self) -> dict:
        """``DistributedDataParallelConfig`` fields."""
        return {"grad_reduce_in_fp32": self.grads_in_fp32 or not self.mixed}

    def optimizer_kwargs(self, optim) -> dict:
        """``OptimizerConfig`` fields (loss scaling from ``optim`` applies to fp16 only)."""
        kwargs = {"fp16": self.name == "fp16", "bf16": self.name == "bf16",
                  "params_dtype": self.params_dtype}
        if self.name == "fp16":
            kwargs.update(loss_scale=optim.loss_scale, initial_loss_scale=optim.initial_loss_scale,
                          min_loss_scale=optim.min_loss_scale,
                          loss_scale_window=optim.loss_scale_window, hysteresis=optim.hysteresis)
        return kwargs

    def describe(self, optim) -> str:
        """Banner text: the dtypes of parameters, gradients and optimizer state."""
        if not self.mixed:
            return "precision: fp32 (params fp32, grads fp32, optimizer state fp32)"
        grads = "fp32 main grads, reduce " + ("fp32" if self.grads_in_fp32 else self.name)
        text = (f"precision: {self.name} (params {self.name} + fp32 main params, {grads}, "
                f"optimizer state fp32")
        if self.name == "fp16":
            if optim.loss_scale:
                text += f", static loss scale {optim.loss_scale:g}"
            else:
                text += (f", dynamic loss scale from {optim.initial_loss_scale:g} "
                         f"(window {optim.loss_scale_window}, hysteresis {optim.hysteresis}, "
                         f"min {optim.min_loss_scale:g})")
        return text + ")"


def for_run(config, device) -> Precision:
    """The :class:`Precision` of a run's config on ``device``."""
    p = config.parallel
    return Precision(resolve(p.mixed_precision, device), p.accumulate_allreduce_grads_in_fp32)


def wrap_model(chunk, mcore_config, precision: Precision):
    """Wrap a model chunk in megatron-core's ``Float16Module`` for bf16 / fp16 (casts the
    parameters, the first stage's inputs and the last stage's outputs)."""
    if not precision.mixed:
        return chunk
    from megatron.core.transformer.module import Float16Module

    return Float16Module(mcore_config, chunk)
