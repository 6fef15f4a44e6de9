"""Distributed-checkpoint tensors of :class:`~.grouped_experts.GroupedExperts`: exactly those of
megatron-core's ``SequentialMLP`` with local ``MLP`` experts, so checkpoints move between the two.

``SequentialMLP`` saves expert ``g`` (global index, of ``G``) of a layer as one slice of
``<prefix>experts.linear_fc1.weight`` / ``linear_fc2.weight`` along an expert axis prepended
after the layer axes (``singleton_local_shards``: as its own ``<prefix>experts.<g>.linear_fc*``
tensor instead), sharded over the expert tensor-parallel group like a column- (fc1) or row- (fc2)
parallel linear, fc1 of a gated unit split into its gate and up halves, each sharded on its own
(``_w`` / ``_v`` keys under ``singleton_local_shards``). Replicas differ only by their expert
data-parallel rank.

Each stacked weight is one ``ShardedTensorFactory`` whose data is the parameter itself, so
megatron-core's optimizers find it and save their states (``exp_avg``, ...) through the same
split; loading merges the expert slices back into the stacked parameter. The (empty)
``_extra_state`` objects ``SequentialMLP``'s linear layers save are saved too, so that
``SequentialMLP`` loads a grouped checkpoint; :func:`drop_extra_state` keeps them out of a strict
``load_state_dict``.
"""

from __future__ import annotations

import torch

_SUFFIX = {"fc1_weight": "linear_fc1.weight", "fc2_weight": "linear_fc2.weight"}


def sharded_state_dict(experts, prefix: str, sharded_offsets: tuple, metadata: dict | None) -> dict:
    """``{<prefix>fc1_weight: factory, <prefix>fc2_weight: factory}`` for ``experts``."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory

    singleton = bool((metadata or {}).get("singleton_local_shards", False))
    layout = _Layout(experts, tuple(sharded_offsets), singleton)
    replica_id = (0, 0, experts.dp_group.rank())
    out = {}
    for name, suffix in _SUFFIX.items():
        gated = experts.gated and name == "fc1_weight"
        out[f"{prefix}{name}"] = ShardedTensorFactory(
            f"{prefix}experts.{suffix}", getattr(experts, name),
            lambda key, data, replica, flattened, s=suffix, g=gated: layout.build(key, data, replica,
                                                                                  flattened, s, g),
            lambda parts, g=gated: layout.merge(parts, g),
            replica_id)
    out.update(_extra_states(layout, prefix, (0, experts.tp_group.rank(), experts.dp_group.rank())))
    return out


def _extra_states(layout: _Layout, prefix: str, replica_id: tuple) -> dict:
    """``SequentialMLP``'s ``_extra_state`` objects of the local experts (None each)."""
    from megatron.core.transformer.utils import make_sharded_object_for_checkpoint

    out = {}
    for e in range(layout.local):
        g = layout.first + e
        for linear in ("linear_fc1", "linear_fc2"):
            if layout.singleton:
                key, offsets = f"{prefix}experts.{g}.{linear}._extra_state", layout.offsets
            else:
                key = f"{prefix}experts.{linear}._extra_state"
                offsets = (*layout.offsets, (len(layout.offsets), g, layout.total))
            out[f"{prefix}local_experts.{e}.{linear}._extra_state"] = make_sharded_object_for_checkpoint(
                None, key, offsets, replica_id)
    return out


def drop_extra_state(module, incompatible_keys) -> None:
    """``load_state_dict`` post-hook: the ``_extra_state`` entries of :func:`_extra_states` are
    expected (they come back from every distributed checkpoint load)."""
    unexpected = incompatible_keys.unexpected_keys
    unexpected[:] = [k for k in unexpected if not (k.endswith("._extra_state") and ".local_experts." in k)]


class _Layout:
    """Where each local expert's slice of a stacked weight goes in the checkpoint."""

    def __init__(self, experts, sharded_offsets: tuple, singleton: bool):
        self.offsets, self.singleton = sharded_offsets, singleton
        self.local = experts.num_local_experts
        self.first = experts.ep_group.rank() * self.local
        self.total = experts.ep_group.size() * self.local
        self.tp_rank, self.tp_size = experts.tp_group.rank(), experts.tp_group.size()

    def build(self, key: str, data: torch.Tensor, replica_id, flattened_range, suffix: str, gated: bool):
        """The ShardedTensors of every local expert (gate and up apart for a gated fc1)."""
        from megatron.core.dist_checkpointing.mapping import ShardedTensor

        if flattened_range is not None:
            raise ValueError(f"{key}: flattened optimizer states of grouped experts are not supported "
                             "(use a distributed-optimizer sharding type other than fully_sharded_model_space).")
        tp_axis = 0 if suffix.startswith("linear_fc1") else 1
        tensors = []
        for e in range(self.local):
            g = self.first + e
            if self.singleton:
                name, offsets = f"{key[: -len(suffix)]}{g}.{suffix}", self.offsets
            else:
                name, offsets = key, (*self.offsets, (len(self.offsets), g, self.total))
            axis = len(offsets) + tp_axis
            if not gated:
                parts = [(name, data[e], (axis, self.tp_rank, self.tp_size))]
            elif self.singleton:
                gate, up = data[e].chunk(2, dim=0)
                parts = [(f"{name}_w", gate, (axis, self.tp_rank, self.tp_size)),
                         (f"{name}_v", up, (axis, self.tp_rank, self.tp_size))]
            else:
                gate, up = data[e].chunk(2, dim=0)
                parts = [(name, gate, (axis, self.tp_rank, 2 * self.tp_size)),
                         (name, up, (axis, self.tp_size + self.tp_rank, 2 * self.tp_size))]
            tensors += [ShardedTensor.from_rank_offsets(k, t, *offsets, tp, replica_id=replica_id,
                                                        prepend_axis_num=len(offsets))
                        for k, t, tp in parts]
        return tensors

    def merge(self, parts: list, gated: bool) -> torch.Tensor:
        """The stacked weight from the loaded slices (in :meth:`build`'s order)."""
        if gated:
            return torch.stack([torch.cat(parts[2 * e: 2 * e + 2]) for e in range(self.local)])
        return torch.stack(list(parts))
