"""LoRA: low-rank adapters on the linear projections of megatron-core models.

``apply_lora(model, LoraConfig(rank=8))`` adds ``lora_A`` / ``lora_B`` (``nn.Linear``, no bias) as
children of every targeted ``ColumnParallelLinear`` / ``RowParallelLinear`` (``linear_qkv``,
``linear_proj``, ``linear_fc1``, ``linear_fc2``), adds ``scaling * B(A(dropout(x)))`` to the
layer's output through a forward hook, and freezes every other parameter. The base weights keep
their names, so checkpoints and HF export see the usual keys plus ``*.lora_A.weight`` /
``*.lora_B.weight``. ``merge_lora(model)`` folds the adapters into the base weights and removes
them (before export to Hugging Face).

Tensor parallelism (each rank holds a shard of the base weight):

- column-parallel ``W_i = W[rows_i]``: ``A`` (``[r, in]``) is replicated, ``B_i = B[rows_i]``
  is sharded like ``W``; ``A x`` enters the TP region like the layer's input (its gradient is
  all-reduced), or is all-gathered along the sequence with sequence parallelism;
- row-parallel ``W_i = W[:, cols_i]``: ``A_i = A[:, cols_i]`` is sharded like ``W``, ``B``
  (``[out, r]``) is replicated; the partial ``A_i x_i`` are summed over TP (reduce-scattered
  along the sequence with sequence parallelism) before ``B``.

Adapters are initialised from a generator seeded by ``(seed, layer name)`` and sliced per rank,
so every TP layout starts from the same full adapter (``A`` Kaiming-uniform, ``B`` zero: the
adapted model starts equal to the base model). Light at import: torch loads on first use.
"""

from __future__ import annotations

import logging
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

from loong_core.config.rules import positive
from loong_core.errors import ConfigError
from loong_core.plugins.registry import did_you_mean

logger = logging.getLogger(__name__)

#: Projections of a megatron-core transformer layer that can carry adapters.
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
_STATE = "_loong_lora"


@dataclass
class LoraConfig:
    """LoRA settings (``model.lora.*``).

    Attributes:
        rank: Adapter rank ``r``; 0 disables LoRA.
        alpha: Scale numerator: the update is ``alpha / rank * B A``.
        dropout: Dropout on the adapter input during training.
        targets: Projection names to adapt (any of ``linear_qkv``, ``linear_proj``,
            ``linear_fc1``, ``linear_fc2``).
        seed: Seed of the adapter initialisation (independent of the TP layout).
    """

    rank: int = 0
    alpha: float = positive(16.0)
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ConfigError(f"model.lora.rank = {self.rank} must be >= 0 (0 disables LoRA).")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout = {self.dropout} must be in [0, 1).")
        for target in self.targets:
            if target not in LORA_TARGETS:
                raise ConfigError(
                    f"Unknown LoRA target '{target}' in model.lora.targets."
                    f"{did_you_mean(target, list(LORA_TARGETS))} Choices: {', '.join(LORA_TARGETS)}."
                )
        if self.rank and not self.targets:
            raise ConfigError("model.lora.targets is empty; name at least one projection.")

    @property
    def enabled(self) -> bool:
        """True when ``rank > 0``."""
        return self.rank > 0

    @property
    def scaling(self) -> float:
        """``alpha / rank``."""
        return self.alpha / self.rank if self.rank else 0.0


def _kind(module) -> str | None:
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    if isinstance(module, ColumnParallelLinear):
        return "column"
    if isinstance(module, RowParallelLinear):
        return "row"
    return None


def _tp():
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()


def _lora_hook(module, args, output):
    from megatron.core.tensor_parallel import mappings

    state = getattr(module, _STATE)
    x = args[0]
    h = module.lora_A(module.lora_dropout(x))
    sp = state["sequence_parallel"]
    if state["kind"] == "column":
        h = (mappings.gather_from_sequence_parallel_region(h) if sp
             else mappings.copy_to_tensor_model_parallel_region(h))
    else:
        h = (mappings.reduce_scatter_to_sequence_parallel_region(h) if sp
             else mappings.reduce_from_tensor_model_parallel_region(h))
    delta = module.lora_B(h) * state["scaling"]
    if isinstance(output, tuple):
        return (output[0] + delta.to(output[0].dtype),) + tuple(output[1:])
    return output + delta.to(output.dtype)


def _sharded_state_dict(module, base_axes: dict[str, int], lora_axes: dict[str, int]):
    """``sharded_state_dict`` of an adapted layer: the TP-sharded adapter is saved sharded."""
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    def sharded_state_dict(prefix="", sharded_offsets=(), metadata=None):
        state_dict = module.state_dict(prefix="", keep_vars=True)
        return make_sharded_tensors_for_checkpoint(
            state_dict, prefix, {**base_axes, **lora_axes}, sharded_offsets,
            tp_group=module.tp_group, dp_cp_group=(metadata or {}).get("dp_cp_group"))

    return sharded_state_dict


def _add_adapter(module, name: str, kind: str, config: LoraConfig) -> None:
    import torch
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    weight = module.weight
    tp, tp_rank = _tp()
    out_local, in_local = weight.shape
    out_full, in_full = (out_local * tp, in_local) if kind == "column" else (out_local, in_local * tp)
    gen = torch.Generator().manual_seed((config.seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    a_full = torch.empty(config.rank, in_full)
    bound = 1.0 / math.sqrt(in_full)  # kaiming_uniform_(a=sqrt(5)), as nn.Linear
    a_full.uniform_(-bound, bound, generator=gen)
    lora_a = torch.nn.Linear(in_local, config.rank, bias=False, device=weight.device, dtype=weight.dtype)
    lora_b = torch.nn.Linear(config.rank, out_local, bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        a = a_full if kind == "column" else a_full[:, tp_rank * in_local: (tp_rank + 1) * in_local]
        lora_a.weight.copy_(a)
        lora_b.weight.zero_()
    sp = bool(getattr(module, "sequence_parallel", False)) and tp > 1
    if kind == "column":
        set_tensor_model_parallel_attributes(lora_b.weight, True, 0, 1)
        lora_a.weight.sequence_parallel = sp  # its gradient sums over sequence shards
        lora_axes = {"lora_B.weight": 0}
        base_axes = {"weight": 0, "bias": 0}
    else:
        set_tensor_model_parallel_attributes(lora_a.weight, True, 1, 1)
        lora_b.weight.sequence_parallel = sp
        lora_axes = {"lora_A.weight": 1}
        base_axes = {"weight": 1}
    module.lora_A, module.lora_B = lora_a, lora_b
    module.lora_dropout = torch.nn.Dropout(config.dropout) if config.dropout else torch.nn.Identity()
    handle = module.register_forward_hook(_lora_hook)
    had_ssd = "sharded_state_dict" in module.__dict__
    module.sharded_state_dict = _sharded_state_dict(module, base_axes, lora_axes)
    setattr(module, _STATE, {"kind": kind, "scaling": config.scaling, "handle": handle,
                             "sequence_parallel": sp, "had_ssd": had_ssd})


def apply_lora(model, config: LoraConfig | dict[str, Any]) -> list[str]:
    """Add adapters to the targeted projections of ``model`` and freeze everything else.

    Args:
        model: A megatron-core model (chunk), possibly wrapped (DDP / Float16Module); apply
            before wrapping with DDP so that only adapters get gradient buffers.
        config: The LoRA settings (a dict is converted).

    Returns:
        Names of the adapted modules.

    Raises:
        ConfigError: No targeted projection exists, or one is a TransformerEngine fused
            layer-norm linear (its input is not the projection's input).
    """
    if isinstance(config, dict):
        config = LoraConfig(**config)
    if not config.enabled:
        return []
    adapted = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in config.targets or hasattr(module, _STATE):
            continue
        kind = _kind(module)
        if kind is None:
            cls = type(module).__name__
            if "LayerNorm" in cls:
                raise ConfigError(f"LoRA cannot adapt {name} ({cls}): it fuses a layer norm; "
                                  "use the local (non-TransformerEngine) layer spec.")
            continue
        if getattr(module, "is_expert", False):
            logger.warning("LoRA skips expert projection %s (experts are not adapted yet)", name)
            continue
        _add_adapter(module, name, kind, config)
        adapted.append(name)
    if not adapted:
        raise ConfigError(
            f"model.lora.targets = {config.targets} matched no ColumnParallelLinear / "
            "RowParallelLinear in the model."
        )
    for pname, param in model.named_parameters():
        param.requires_grad = ".lora_A." in pname or ".lora_B." in pname
    logger.info("LoRA rank %d on %d projections; %d trainable parameters", config.rank,
                len(adapted), sum(p.numel() for p in model.parameters() if p.requires_grad))
    return adapted


def lora_parameters(model) -> dict[str, Any]:
    """The adapter parameters of ``model`` by name."""
    return {n: p for n, p in model.named_parameters() if ".lora_A." in n or ".lora_B." in n}


def merge_lora(model) -> int:
    """Fold every adapter into its base weight and remove it (in place).

    ``W += scaling * B @ A`` on each rank's shard (``B_i @ A`` for column-parallel, ``B @ A_i``
    for row-parallel layers: no communication). Afterwards the model is a plain megatron model
    with the usual parameter names, ready for export.

    Args:
        model: A model (chunk) that :func:`apply_lora` adapted.

    Returns:
        Number of merged projections.
    """
    import torch

    merged = 0
    for module in list(model.modules()):
        state = getattr(module, _STATE, None)
        if state is None:
            continue
        with torch.no_grad():
            delta = module.lora_B.weight.float() @ module.lora_A.weight.float()
            module.weight.add_((delta * state["scaling"]).to(module.weight.dtype))
        state["handle"].remove()
        del module.lora_A, module.lora_B, module.lora_dropout
        if not state["had_ssd"]:
            del module.sharded_state_dict
        delattr(module, _STATE)
        merged += 1
    return merged
