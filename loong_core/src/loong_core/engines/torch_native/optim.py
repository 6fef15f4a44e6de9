"""AdamW / SGD and a Megatron-style learning-rate schedule from :class:`OptimConfig`."""

from __future__ import annotations

import math

import torch


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two groups, as megatron-core makes them: matrices decay, biases and norm weights do not."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(config, model: torch.nn.Module, auto_fused: bool = True) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` (``optim.optimizer=adam``) or ``SGD`` with momentum, in the
    implementation ``optim.implementation`` picks (``auto_fused``: the device backend's
    ``fused_optimizers``)."""
    from loong_core.engines import optimizer_implementation

    o = config.optim
    groups = param_groups(model, o.weight_decay)
    if o.optimizer == "adam":
        optimizer = torch.optim.AdamW(groups, lr=o.lr, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps,
                                      weight_decay=o.weight_decay)
    else:
        optimizer = torch.optim.SGD(groups, lr=o.lr, momentum=o.sgd_momentum, weight_decay=o.weight_decay)
    optimizer_implementation.apply([optimizer], o.implementation, auto_fused)
    return optimizer


class LRSchedule:
    """Linear warmup from 0 to ``lr``, then ``cosine`` / ``linear`` / ``constant`` decay to ``min_lr``.

    Follows megatron-core's ``OptimizerParamScheduler``: the learning rate of optimizer step ``n``
    (0-based) is ``lr_at(n)``; :meth:`step` is called after each optimizer step. The state is the
    step count, so resuming restores the schedule exactly.

    Args:
        optimizer: The optimizer whose param groups are updated.
        config: The run config (``optim`` and ``trainer.train_iters``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, config):
        o = config.optim
        self.optimizer = optimizer
        self.max_lr, self.min_lr, self.style = o.lr, o.min_lr, o.lr_decay_style
        self.warmup = o.lr_warmup_iters
        self.decay_steps = max(o.lr_decay_iters or config.trainer.train_iters, self.warmup + 1)
        self.num_steps = 0
        self._apply()

    def lr_at(self, step: int) -> float:
        """Learning rate after ``step`` completed optimizer steps."""
        if self.warmup > 0 and step <= self.warmup:
            return self.max_lr * step / self.warmup
        if self.style == "constant":
            return self.max_lr
        if step > self.decay_steps:
            return self.min_lr
        ratio = (step - self.warmup) / (self.decay_steps - self.warmup)
        if self.style == "linear":
            coeff = 1.0 - ratio
        else:
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)

    def _apply(self) -> None:
        lr = self.lr_at(self.num_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        """Advance one optimizer step."""
        self.num_steps += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"num_steps": self.num_steps}

    def load_state_dict(self, state: dict) -> None:
        self.num_steps = int(state["num_steps"])
        self._apply()
