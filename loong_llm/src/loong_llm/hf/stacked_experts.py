"""Checkpoints that store each layer's routed experts stacked in two 3D tensors (Qwen3-VL-MoE):
``<mlp>.experts.gate_up_proj`` and ``<mlp>.experts.down_proj`` instead of one ``gate_proj`` /
``up_proj`` / ``down_proj`` per expert.

The families' rule tables stay in the per-expert names (``<mlp>.experts.{e}.gate_proj.weight``,
...): :class:`StackedExpertsReader` serves those names as views of the stacked tensors on the way
in, and :class:`ExpertStacker` stacks them again on the way out, one tensor as soon as all its
experts are there.

Layouts: transformers keeps ``gate_up_proj [E, 2I, H]`` (each expert's ``[gate; up]`` rows, as
megatron-core's ``linear_fc1``) and ``down_proj [E, H, I]``, and writes them so; the published
checkpoints hold the transpose of each (``[E, H, 2I]``, ``[E, I, H]``), which transformers turns
on load when the shape says so. The reader does the same (by the hidden size), the stacker writes
transformers' own layout.
"""

from __future__ import annotations

import re

_STACKED = re.compile(r"^(?P<mlp>.+\.experts\.)(?P<kind>gate_up_proj|down_proj)$")
_PER_EXPERT = re.compile(r"^(?P<mlp>.+\.experts\.)(?P<e>\d+)\.(?P<part>gate_proj|up_proj|down_proj)\.weight$")


class StackedExpertsReader:
    """A safetensors reader (``get``, ``keys``, ``bytes_read``) that also serves the per-expert
    names of stacked expert tensors.

    Args:
        inner: The reader of the checkpoint's own names
            (:class:`~loong_llm.hf.io.SafetensorsReader`).
        hidden_size: The decoder's width (tells the two layouts apart).
    """

    def __init__(self, inner, hidden_size: int):
        if not hasattr(inner, "shape"):
            raise TypeError("StackedExpertsReader needs a reader with shape() (SafetensorsReader)")
        self.inner, self.hidden_size = inner, hidden_size
        self._virtual: dict[str, tuple[str, int, str]] = {}
        for name in inner.keys():
            m = _STACKED.match(name)
            if m is None:
                continue
            experts = inner.shape(name)[0]
            parts = ("gate_proj", "up_proj") if m["kind"] == "gate_up_proj" else ("down_proj",)
            for e in range(experts):
                for part in parts:
                    self._virtual[f"{m['mlp']}{e}.{part}.weight"] = (name, e, part)

    @property
    def bytes_read(self) -> int:
        return self.inner.bytes_read

    def keys(self) -> list[str]:
        """The checkpoint's names with each stacked tensor replaced by its per-expert names."""
        stacked = {source for source, _, _ in self._virtual.values()}
        return sorted([n for n in self.inner.keys() if n not in stacked] + list(self._virtual))

    def __contains__(self, name: str) -> bool:
        return name in self._virtual or name in self.inner

    def get(self, name: str):
        """The tensor ``name``; a per-expert name is a view of its stacked tensor."""
        if name not in self._virtual:
            return self.inner.get(name)
        source, e, part = self._virtual[name]
        expert = self.inner.get(source)[e]
        if part == "down_proj":  # [H, I]; published: [I, H]
            return expert if expert.shape[0] == self.hidden_size else expert.T
        if expert.shape[-1] != self.hidden_size:  # published [H, 2I]
            expert = expert.T
        gate, up = expert.chunk(2, dim=0)
        return gate if part == "gate_proj" else up


class ExpertStacker:
    """Collects per-expert HF tensors on their way out and returns each stacked tensor once all
    ``num_experts`` of its experts have arrived (other tensors pass through at once).

    Args:
        num_experts: Routed experts per layer.
    """

    def __init__(self, num_experts: int):
        self.num_experts = num_experts
        self._pending: dict[str, dict[tuple[int, str], object]] = {}

    def add(self, name: str, tensor) -> list[tuple[str, object]]:
        """``[(name, tensor)]`` ready to write after ``name`` arrived (possibly none)."""
        import torch

        m = _PER_EXPERT.match(name)
        if m is None:
            return [(name, tensor)]
        kind = "down_proj" if m["part"] == "down_proj" else "gate_up_proj"
        target = m["mlp"] + kind
        pieces = self._pending.setdefault(target, {})
        pieces[(int(m["e"]), m["part"])] = tensor
        per_expert = 1 if kind == "down_proj" else 2
        if len(pieces) < per_expert * self.num_experts:
            return []
        del self._pending[target]
        if kind == "down_proj":
            return [(target, torch.stack([pieces[(e, "down_proj")] for e in range(self.num_experts)]))]
        return [(target, torch.stack([torch.cat([pieces[(e, "gate_proj")], pieces[(e, "up_proj")]])
                                      for e in range(self.num_experts)]))]

    def close(self) -> None:
        """Raise unless every stacked tensor was completed."""
        from loong_core.errors import CheckpointError

        if self._pending:
            got = {target: len(pieces) for target, pieces in self._pending.items()}
            raise CheckpointError(f"internal: stacked expert tensors left incomplete (pieces "
                                  f"received of {self.num_experts} experts): {got}")
