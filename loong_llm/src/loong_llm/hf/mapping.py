"""Declarative HF <-> loong name mapping: one :class:`Rule` per tensor family, plus transforms.

Loong names are megatron-core GPTModel state-dict names with *global* indices (layer ``{i}``,
expert ``{e}``), e.g. ``decoder.layers.{i}.mlp.linear_fc1.weight``. A rule says which HF tensors
make up one loong tensor and how (``kind``):

- ``copy``: the same tensor.
- ``vocab``: embedding / output rows; padded with zero rows to the padded vocabulary on the way
  in, cut back to ``vocab_size`` on the way out.
- ``qkv``: HF ``q``, ``k``, ``v`` projections (weight or bias) interleaved by query group: for each
  group its query heads, then its key head, then its value head (megatron-core's layout).
- ``gate_up``: HF ``gate`` and ``up`` stacked as ``[gate; up]``; under TP rank r holds
  ``[gate_r; up_r]``.
- ``gated_qkv``: as ``qkv`` with an output gate projected with the queries (HF ``q_proj`` holds
  each head's query then its gate): per group its query heads, their gates, its key head, its
  value head (megatron-core's layout under ``attention_output_gate``).
- ``grouped``: HF tensors whose rows are sections (each all groups' rows of one kind, e.g. all
  query channels, then all key channels, ...) stacked and regrouped group by group: per group its
  rows of each section (``Rule.sections``: one group's width in each), so TP shards whole groups.
- ``rope_rows``: rows in blocks of ``block`` whose last ``Shape.rope_dim`` rows are RoPE dims.
  megatron-core's MLA expects them in interleaved pairs (DeepSeek's original layout) and
  de-interleaves at run time; a checkpoint in the half-split layout (``rope_interleave=false``) is
  interleaved on the way in (row ``2i`` <- ``i``, ``2i+1`` <- ``d/2+i``) and split back on export.

Routed experts have two loong layouts (``model.moe_grouped_gemm``): megatron-core's
``SequentialMLP`` (``...experts.local_experts.{e}.linear_fc1.weight``, one tensor per expert, what
the families' rules name) and loong's grouped experts (``...experts.fc1_weight``, all of a rank's
experts stacked on a first axis). :class:`RuleSet` derives a *stacked* twin of every per-expert
``linear_fc1`` / ``linear_fc2`` rule: the same HF names and transform for each expert, the results
stacked; the twin's HF names cover all experts (:attr:`Shape.num_experts`) or a given range of
them (an expert-parallel rank's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("copy", "vocab", "qkv", "gated_qkv", "grouped", "gate_up", "rope_rows")


@dataclass(frozen=True)
class Rule:
    """One loong tensor and the HF tensors it is made of.

    Attributes:
        loong: Loong name template (``{i}`` layer, ``{e}`` expert).
        hf: HF name templates, in the order the transform expects.
        kind: Transform (see module docstring).
        export: Whether loong -> HF writes it (False for the tied output layer).
        block: Rows per block (``rope_rows`` only).
        also: Further HF names written with the same tensor on export and never read (the
            copies of the embedding and output head DeepSeek-V3's MTP layers carry); only for
            rules of one HF tensor.
        sections: ``grouped`` only: one group's rows in each section; with several HF tensors
            a tuple per tensor (its sections, in order).
        stacked: The loong tensor stacks experts on a first axis; ``hf`` are one expert's
            names (with ``{e}``), repeated for each expert.
    """

    loong: str
    hf: tuple[str, ...]
    kind: str = "copy"
    export: bool = True
    block: int = 0
    also: tuple[str, ...] = ()
    sections: tuple[int, ...] = ()
    stacked: bool = False

    def regex(self) -> re.Pattern:
        """Pattern matching concrete loong names of this rule."""
        pattern = re.escape(self.loong).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{e\}", r"(?P<e>\d+)")
        return re.compile(f"^{pattern}$")


@dataclass(frozen=True)
class Shape:
    """What the transforms need to know of the model.

    Attributes:
        num_heads: Query heads.
        num_groups: Key/value heads.
        head_dim: Per-head width.
        vocab_size: True vocabulary (HF rows).
        rope_dim: RoPE width of ``rope_rows`` tensors.
        num_experts: Routed experts per layer (the HF names of a stacked rule).
    """

    num_heads: int
    num_groups: int
    head_dim: int
    vocab_size: int
    rope_dim: int = 0
    num_experts: int = 0


_PER_EXPERT = {"local_experts.{e}.linear_fc1.weight": "fc1_weight",
               "local_experts.{e}.linear_fc2.weight": "fc2_weight"}


def stacked_twins(rules: list[Rule]) -> list[Rule]:
    """The stacked (grouped-experts) rule of each per-expert ``linear_fc1`` / ``linear_fc2`` rule."""
    from dataclasses import replace

    twins = []
    for rule in rules:
        for per_expert, grouped in _PER_EXPERT.items():
            if rule.loong.endswith(per_expert) and not rule.stacked:
                twins.append(replace(rule, loong=rule.loong[: -len(per_expert)] + grouped, stacked=True))
    return twins


def _per_tensor(rule: Rule) -> tuple[tuple[int, ...], ...]:
    """``grouped``: each HF tensor's sections (``sections`` flat: one tensor holds them all)."""
    if rule.sections and isinstance(rule.sections[0], tuple):
        return rule.sections
    return (rule.sections,)


class RuleSet:
    """The rules of one model, with lookup from concrete loong names."""

    def __init__(self, rules: list[Rule], shape: Shape):
        self.rules = [*rules, *stacked_twins(rules)]
        self.shape = shape
        self._compiled = [(rule, rule.regex()) for rule in self.rules]

    def match(self, loong_name: str, experts: range | None = None) -> tuple[Rule, list[str]]:
        """The rule of ``loong_name`` and its concrete HF names; KeyError when none matches.

        A stacked rule's names are those of ``experts`` (default: all ``Shape.num_experts``),
        expert by expert."""
        for rule, regex in self._compiled:
            m = regex.match(loong_name)
            if m:
                values = m.groupdict()
                if not rule.stacked:
                    return rule, [h.format(**values) for h in rule.hf]
                experts = range(self.shape.num_experts) if experts is None else experts
                return rule, [h.format(**values, e=e) for e in experts for h in rule.hf]
        raise KeyError(loong_name)

    def export_names(self, loong_name: str) -> tuple[Rule, list[str]]:
        """Like :meth:`match`, with the rule's ``also`` copies after its HF names."""
        rule, names = self.match(loong_name)
        values = rule.regex().match(loong_name).groupdict()
        return rule, [*names, *(a.format(**values) for a in rule.also)]

    @staticmethod
    def per_expert(rule: Rule) -> Rule:
        """The rule of one expert of a stacked rule."""
        from dataclasses import replace

        return replace(rule, stacked=False)

    def _rope_perm(self, rule: Rule, inverse: bool):
        import torch

        d = self.shape.rope_dim
        perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
        if inverse:
            perm = torch.argsort(perm)
        return torch.cat([torch.arange(rule.block - d), rule.block - d + perm])

    def _permute_blocks(self, rule: Rule, t, inverse: bool):
        rest = t.shape[1:]
        blocks = t.reshape(-1, rule.block, *rest)
        return blocks[:, self._rope_perm(rule, inverse)].reshape(-1, *rest)

    # -- transforms ------------------------------------------------------------------------
    def to_loong(self, rule: Rule, tensors: list, rows: int | None = None):
        """Full (unsharded) loong tensor from the HF tensors; ``rows``: padded vocabulary."""
        import torch

        if rule.stacked:
            one, k = self.per_expert(rule), len(rule.hf)
            return torch.stack([self.to_loong(one, tensors[i: i + k]) for i in range(0, len(tensors), k)])
        if rule.kind == "copy":
            return tensors[0]
        if rule.kind == "vocab":
            (t,) = tensors
            if rows is not None and rows > t.shape[0]:
                pad = torch.zeros((rows - t.shape[0], *t.shape[1:]), dtype=t.dtype)
                t = torch.cat([t, pad])
            return t
        if rule.kind == "gate_up":
            return torch.cat(tensors, dim=0)
        if rule.kind == "rope_rows":
            return self._permute_blocks(rule, tensors[0], inverse=True)
        if rule.kind == "grouped":
            widths = [w for part in _per_tensor(rule) for w in part]
            t = torch.cat(tensors)
            rest = t.shape[1:]
            groups = t.shape[0] // sum(widths)
            parts = t.split([groups * w for w in widths])
            return torch.cat([p.reshape(groups, w, *rest) for p, w in zip(parts, widths)],
                             dim=1).reshape(-1, *rest)
        if rule.kind == "gated_qkv":
            q, k, v = tensors
            s = self.shape
            rest = q.shape[1:]
            per_group = s.num_heads // s.num_groups
            q = q.reshape(s.num_groups, per_group, 2, s.head_dim, *rest)
            k = k.reshape(s.num_groups, s.head_dim, *rest)
            v = v.reshape(s.num_groups, s.head_dim, *rest)
            query, gate = (q[:, :, i].reshape(s.num_groups, per_group * s.head_dim, *rest) for i in (0, 1))
            return torch.cat([query, gate, k, v], dim=1).reshape(-1, *rest)
        if rule.kind == "qkv":
            q, k, v = tensors
            s = self.shape
            rest = q.shape[1:]
            per_group = s.num_heads // s.num_groups * s.head_dim
            q = q.reshape(s.num_groups, per_group, *rest)
            k = k.reshape(s.num_groups, s.head_dim, *rest)
            v = v.reshape(s.num_groups, s.head_dim, *rest)
            return torch.cat([q, k, v], dim=1).reshape(-1, *rest)
        raise ValueError(f"unknown mapping kind {rule.kind!r}; kinds: {', '.join(KINDS)}")

    def to_hf(self, rule: Rule, full) -> list:
        """HF tensors (in ``rule.hf`` order, then the ``also`` copies) from the full loong tensor."""
        tensors = self._to_hf(rule, full)
        return tensors + tensors[:1] * len(rule.also)

    def _to_hf(self, rule: Rule, full) -> list:
        if rule.stacked:
            one = self.per_expert(rule)
            return [t for expert in full for t in self._to_hf(one, expert)]
        if rule.kind == "copy":
            return [full]
        if rule.kind == "vocab":
            return [full[: self.shape.vocab_size]]
        if rule.kind == "gate_up":
            return list(full.chunk(2, dim=0))
        if rule.kind == "rope_rows":
            return [self._permute_blocks(rule, full, inverse=False)]
        if rule.kind == "grouped":
            import torch

            rest = full.shape[1:]
            per_tensor = _per_tensor(rule)
            widths = [w for part in per_tensor for w in part]
            sections = iter(full.reshape(-1, sum(widths), *rest).split(widths, dim=1))
            return [torch.cat([next(sections).reshape(-1, *rest) for _ in part]) for part in per_tensor]
        if rule.kind == "gated_qkv":
            import torch

            s = self.shape
            rest = full.shape[1:]
            per_group = s.num_heads // s.num_groups
            width = per_group * s.head_dim
            grouped = full.reshape(s.num_groups, 2 * width + 2 * s.head_dim, *rest)
            query, gate, k, v = grouped.split([width, width, s.head_dim, s.head_dim], dim=1)
            q = torch.stack([query.reshape(s.num_groups, per_group, s.head_dim, *rest),
                             gate.reshape(s.num_groups, per_group, s.head_dim, *rest)], dim=2)
            return [t.reshape(-1, *rest) for t in (q, k, v)]
        if rule.kind == "qkv":
            s = self.shape
            rest = full.shape[1:]
            per_group = s.num_heads // s.num_groups * s.head_dim
            grouped = full.reshape(s.num_groups, per_group + 2 * s.head_dim, *rest)
            q, k, v = grouped.split([per_group, s.head_dim, s.head_dim], dim=1)
            return [t.reshape(-1, *rest) for t in (q, k, v)]
        raise ValueError(f"unknown mapping kind {rule.kind!r}; kinds: {', '.join(KINDS)}")

    @staticmethod
    def shard(rule: Rule, full, partition_dim: int | None, rank: int, size: int):
        """This TP rank's part of ``full`` (``partition_dim`` None: replicated)."""
        if partition_dim is None or size == 1:
            return full
        if rule.stacked:  # each expert's part (partition_dim counts the expert axis)
            import torch

            one = RuleSet.per_expert(rule)
            return torch.stack([RuleSet.shard(one, expert, partition_dim - 1, rank, size) for expert in full])
        if rule.kind == "gate_up":
            import torch

            gate, up = full.chunk(2, dim=0)
            return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]])
        return full.chunk(size, dim=partition_dim)[rank]
