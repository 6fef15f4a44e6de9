"""Routed experts as two grouped matrix products per MoE layer, no Python module per expert.

A drop-in for megatron-core's ``SequentialMLP`` (the ``experts`` of its ``MoELayer``): the same
call (``(tokens sorted by expert, tokens per expert, routing probabilities) -> (output, None)``),
the same numbers, the same initial values from the same seed, and the same distributed-checkpoint
tensors (see :mod:`.grouped_experts_checkpoint`), so a checkpoint saved with either loads into
the other. megatron-core's own grouped class (``GroupedMLP``) needs the CUDA-only
``grouped_gemm`` package and bf16; this one runs wherever :mod:`.grouped_matmul` does.

Parameters, this rank's experts stacked, each expert's matrix in ``nn.Linear`` layout (that of
``SequentialMLP``'s ``linear_fc1`` / ``linear_fc2`` and of HF checkpoints):

- ``fc1_weight [E_local, 2F/tp, H]``: each expert's ``[gate; up]`` rows (``[F/tp, H]`` without a
  gated unit); under expert tensor parallelism rank r holds ``[gate_r; up_r]``.
- ``fc2_weight [E_local, H, F/tp]``: partial sums under expert tensor parallelism, reduced by the
  token dispatcher as for ``SequentialMLP``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule

from loong_core.kernels import grouped_matmul
from loong_llm.families.common import grouped_experts_checkpoint


def unsupported_reason(config) -> str | None:
    """Why :class:`GroupedExperts` cannot stand in for ``SequentialMLP`` under ``config`` (None:
    it can)."""
    if config.add_bias_linear:
        return "the experts have biases (model.add_bias_linear)"
    if getattr(config, "fp8", None) or getattr(config, "fp4", None):
        return "fp8 / fp4 experts need TransformerEngine's grouped linear"
    if getattr(config, "moe_latent_size", None):
        return "latent MoE projections (moe_latent_size)"
    if getattr(config, "activation_func_clamp_value", None) is not None:
        return "a clamped activation (activation_func_clamp_value)"
    if getattr(config, "glu_linear_offset", 0.0):
        return "a gated unit with a linear offset (glu_linear_offset)"
    return None


def replace_sequential_experts(spec, module: type) -> int:
    """Make every ``SequentialMLP`` experts spec in ``spec`` (a block or layer spec, modified in
    place) a ``ModuleSpec`` of ``module``; returns how many were replaced."""
    import dataclasses

    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.spec_utils import ModuleSpec

    seen: set[int] = set()

    def walk(node) -> int:
        if id(node) in seen or node is None or isinstance(node, type):
            return 0
        seen.add(id(node))
        if isinstance(node, (list, tuple)):
            return sum(walk(item) for item in node)
        if isinstance(node, ModuleSpec):
            return walk(node.submodules)
        if not dataclasses.is_dataclass(node):
            return 0
        count = 0
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if isinstance(value, ModuleSpec) and value.module is SequentialMLP:
                setattr(node, f.name, ModuleSpec(module=module))
                count += 1
            else:
                count += walk(value)
        return count

    return walk(spec)


def _groups(pg_collection):
    """``(ep, expert tp, expert dp)`` process groups."""
    if pg_collection is not None:
        return pg_collection.ep, pg_collection.expt_tp, pg_collection.expt_dp
    from megatron.core import parallel_state as ps

    return (ps.get_expert_model_parallel_group(), ps.get_expert_tensor_parallel_group(),
            ps.get_expert_data_parallel_group())


class GroupedExperts(MegatronModule):
    """This rank's routed experts of one MoE layer (see the module docstring).

    Args:
        num_local_experts: Experts held by this rank.
        config: The ``TransformerConfig`` (``moe_ffn_hidden_size``, ``gated_linear_unit``,
            ``activation_func``, ``moe_apply_probs_on_input``).
        submodules: Ignored (the spec of ``SequentialMLP`` passes its linear layers' classes).
        pg_collection: megatron-core's process groups (``ep``, ``expt_tp``, ``expt_dp``); None:
            its parallel state's.
    """

    def __init__(self, num_local_experts: int, config, submodules=None, pg_collection=None):
        super().__init__(config=config)
        reason = unsupported_reason(config)
        if reason is not None:
            raise ValueError(f"grouped experts do not support {reason}; use model.moe_grouped_gemm=false.")
        self.num_local_experts = num_local_experts
        self.ep_group, self.tp_group, self.dp_group = _groups(pg_collection)
        tp = self.tp_group.size()
        ffn = config.moe_ffn_hidden_size
        if ffn % tp:
            raise ValueError(f"moe_ffn_hidden_size {ffn} is not divisible by the expert tensor-parallel size {tp}")
        self.ffn_per_rank = ffn // tp
        self.gated = bool(config.gated_linear_unit)
        self.swiglu = None
        if self.gated and config.activation_func is F.silu:
            from loong_core.engines.megatron.seam.modules import SeamSwiGLU

            self.swiglu = SeamSwiGLU()  # the kernel seam's activation (kernels.swiglu)
        fc1_rows = self.ffn_per_rank * (2 if self.gated else 1)
        # on the default device (the engine moves the model to its device, as with loong's
        # use_cpu_initialization=True for every family)
        empty = dict(dtype=config.params_dtype)
        self.fc1_weight = torch.nn.Parameter(torch.empty(num_local_experts, fc1_rows, config.hidden_size, **empty))
        self.fc2_weight = torch.nn.Parameter(torch.empty(num_local_experts, config.hidden_size, self.ffn_per_rank,
                                                         **empty))
        self._mark_parallel()
        self.register_load_state_dict_post_hook(grouped_experts_checkpoint.drop_extra_state)
        if config.perform_initialization:
            self._initialize()

    def _mark_parallel(self) -> None:
        """The attributes megatron-core's expert linear layers give their weights: sharded over
        the expert TP group (fc1 by rows, fc2 by columns), reduced over the expert data-parallel
        group (not the whole DP group) when experts are split over ranks."""
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        expert_parallel = self.config.expert_model_parallel_size > 1
        for weight, dim in ((self.fc1_weight, 1), (self.fc2_weight, 2)):
            set_tensor_model_parallel_attributes(weight, is_parallel=True, dim=dim, stride=1)
            weight.allreduce = not expert_parallel

    @torch.no_grad()
    def _initialize(self) -> None:
        """The draws of ``SequentialMLP``'s initialisation: expert by expert, fc1's then fc2's
        whole matrix (fp32, ``init_method`` / ``output_layer_init_method``), this rank's slice
        kept. Without CPU initialisation: each local slice drawn under the expert-parallel RNG."""
        c = self.config
        tp, rank = self.tp_group.size(), self.tp_group.rank()
        if not c.use_cpu_initialization:
            from megatron.core.tensor_parallel.random import (
                get_cuda_rng_tracker,
                get_expert_parallel_rng_tracker_name,
            )

            with get_cuda_rng_tracker().fork(get_expert_parallel_rng_tracker_name()):
                for e in range(self.num_local_experts):
                    c.init_method(self.fc1_weight[e])
                    c.output_layer_init_method(self.fc2_weight[e])
            return
        for e in range(self.num_local_experts):
            for weight, init, dim in ((self.fc1_weight, c.init_method, 0),
                                      (self.fc2_weight, c.output_layer_init_method, 1)):
                local = weight[e]
                full = torch.empty(*(n * tp if d == dim else n for d, n in enumerate(local.shape)),
                                   dtype=torch.float32)
                init(full)
                local.copy_(full.to(weight.dtype).chunk(tp, dim=dim)[rank])

    def forward(self, hidden: torch.Tensor, tokens_per_expert: torch.Tensor, probs: torch.Tensor):
        """``(output [T, H], None)`` of the tokens ``hidden [T, H]`` sorted by expert
        (``tokens_per_expert [E_local]``), each scaled by its routing probability ``probs [T]``."""
        if self.config.moe_apply_probs_on_input:
            if self.config.moe_router_topk != 1:
                raise ValueError("moe_apply_probs_on_input needs moe_router_topk=1")
            hidden = (probs.unsqueeze(-1) * hidden).to(hidden.dtype)
            probs = torch.ones_like(probs)
        bucket = grouped_matmul.row_bucket(hidden)
        if bucket:  # each expert's rows padded with zero rows (a few product shapes; see grouped_matmul)
            rows = hidden.shape[0]
            destination, tokens_per_expert, padded = grouped_matmul.bucket_rows(
                tokens_per_expert.to(hidden.device), bucket, rows)
            hidden = grouped_matmul.pad_rows(hidden, destination, padded)
            probs = grouped_matmul.pad_rows(probs, destination, padded)
        fc1 = grouped_matmul.grouped_linear(hidden, self.fc1_weight, tokens_per_expert)
        intermediate = self._activate(fc1, probs)
        out = grouped_matmul.grouped_linear(intermediate, self.fc2_weight, tokens_per_expert)
        return (out.index_select(0, destination) if bucket else out), None

    def _activate(self, fc1: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """The activation (the kernel seam's SwiGLU for a gated SiLU) times the routing
        probability, in fc1's dtype: the one place both are applied."""
        act = self.config.activation_func
        if self.swiglu is not None:
            out = self.swiglu(fc1)
        elif self.gated:
            gate, up = torch.chunk(fc1, 2, dim=-1)
            out = act(gate) * up
        else:
            out = act(fc1)
        return (out * probs.unsqueeze(-1)).to(fc1.dtype)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata=None) -> dict:
        """The distributed-checkpoint tensors of ``SequentialMLP`` (one per expert, under
        ``<prefix>experts.linear_fc1.weight`` / ``linear_fc2.weight``), for the weights and,
        through the same factories, their optimizer states."""
        return grouped_experts_checkpoint.sharded_state_dict(self, prefix, sharded_offsets, metadata)

    def backward_dw(self) -> None:
        """Nothing deferred: the weight gradients are computed in the backward."""
