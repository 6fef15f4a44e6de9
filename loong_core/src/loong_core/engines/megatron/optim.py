"""megatron-core optimizer and LR scheduler from :class:`~loong_core.config.schema.OptimConfig`."""

from __future__ import annotations

from loong_core.engines import optimizer_implementation
from loong_core.engines.megatron import distopt_fixes, precision


def build(config, model_chunks, prec: precision.Precision | None = None, auto_fused: bool = True):
    """Return ``(optimizer, scheduler)``; the scheduler counts optimizer steps (iterations).

    Args:
        config: The run config.
        model_chunks: The DDP-wrapped model chunks.
        prec: The run's precision (None: fp32); bf16 / fp16 build megatron-core's
            mixed-precision optimizer with fp32 main parameters.
        auto_fused: ``optim.implementation=auto`` may take torch's fused kernel (the device
            backend's ``fused_optimizers``).
    """
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    o, p, t = config.optim, config.parallel, config.trainer
    distopt_fixes.apply()
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer=o.optimizer,
            lr=o.lr,
            min_lr=o.min_lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.adam_beta1,
            adam_beta2=o.adam_beta2,
            adam_eps=o.adam_eps,
            sgd_momentum=o.sgd_momentum,
            clip_grad=o.clip_grad,
            use_distributed_optimizer=p.use_distributed_optimizer,
            overlap_param_gather=p.overlap_param_gather,
            **(prec or precision.Precision("fp32")).optimizer_kwargs(o),
        ),
        model_chunks,
    )
    optimizer_implementation.apply(optimizer_implementation.torch_optimizers(optimizer), o.implementation,
                                   auto_fused)
    decay_iters = o.lr_decay_iters or t.train_iters
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if o.lr_warmup_iters else o.lr,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=o.lr_warmup_iters,
        lr_decay_steps=max(decay_iters, o.lr_warmup_iters + 1),
        lr_decay_style=o.lr_decay_style,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=max(decay_iters, 1),
        wd_incr_style="constant",
    )
    return optimizer, scheduler
