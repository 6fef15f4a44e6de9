"""ERNIE-4.5-VL's stored tensor layout (Baidu's published checkpoints; transformers'
``save_pretrained`` writes it too) and the per-modality names the adapter's rules use.

Stored, per MoE layer ``model.layers.N.mlp.``: one expert list whose first ``E`` entries are the
text experts and the next ``E`` the vision experts (``experts.K.{gate,up,down}_proj.weight``),
the routers transposed (``gate.weight`` text, ``gate.weight_1`` vision, ``[hidden, E]``) and both
expert-score biases in one ``[2, E]`` ``moe_statics.e_score_correction_bias``. The rules read
``text_moe.`` / ``vision_moe.`` names (``gate.weight`` ``[E, hidden]``,
``gate.e_score_correction_bias`` ``[E]``, ``experts.e.*`` numbered from 0 in each);
:class:`ErnieReader` serves them from the stored tensors and :class:`ErnieWriter` turns them back.
"""

from __future__ import annotations

import re

_ROUTER = re.compile(r"^(?P<mlp>model\.layers\.\d+\.mlp\.)gate\.weight(?P<vision>_1)?$")
_BIAS = re.compile(r"^(?P<mlp>model\.layers\.\d+\.mlp\.)moe_statics\.e_score_correction_bias$")
_EXPERT = re.compile(r"^(?P<mlp>model\.layers\.\d+\.mlp\.)experts\.(?P<k>\d+)\.(?P<rest>.+)$")
_MODAL = re.compile(r"^(?P<mlp>model\.layers\.\d+\.mlp\.)(?P<part>text_moe|vision_moe)\.(?P<rest>.+)$")
_PARTS = ("text_moe", "vision_moe")


class ErnieReader:
    """A :class:`~loong_llm.hf.io.SafetensorsReader` serving the per-modality names.

    Args:
        inner: The reader of the stored names.
        num_experts: Experts per modality (``E``).
    """

    def __init__(self, inner, num_experts: int):
        self.inner, self.num_experts = inner, num_experts
        self._virtual: dict[str, tuple[str, str, int]] = {}  # name -> (stored, how, index)
        self._stored: set[str] = set()
        for name in inner.keys():
            if m := _ROUTER.match(name):
                part = _PARTS[bool(m["vision"])]
                self._virtual[f"{m['mlp']}{part}.gate.weight"] = (name, "transpose", 0)
            elif m := _BIAS.match(name):
                for row, part in enumerate(_PARTS):
                    self._virtual[f"{m['mlp']}{part}.gate.e_score_correction_bias"] = (name, "row", row)
            elif m := _EXPERT.match(name):
                k = int(m["k"])
                part, e = _PARTS[k >= num_experts], k % num_experts
                self._virtual[f"{m['mlp']}{part}.experts.{e}.{m['rest']}"] = (name, "copy", 0)
            else:
                continue
            self._stored.add(name)

    @property
    def bytes_read(self) -> int:
        return self.inner.bytes_read

    def keys(self) -> list[str]:
        """The stored names with the MoE tensors under their per-modality names."""
        return sorted([n for n in self.inner.keys() if n not in self._stored] + list(self._virtual))

    def __contains__(self, name: str) -> bool:
        return name in self._virtual or name in self.inner

    def get(self, name: str):
        if name not in self._virtual:
            return self.inner.get(name)
        stored, how, row = self._virtual[name]
        tensor = self.inner.get(stored)
        if how == "transpose":
            return tensor.t().contiguous()
        return tensor[row].contiguous() if how == "row" else tensor


class ErnieWriter:
    """The export side (``export_stacker``): per-modality names back to the stored layout; the two
    expert-score biases of a layer are written together once both arrived.

    Args:
        num_experts: Experts per modality (``E``).
    """

    def __init__(self, num_experts: int):
        self.num_experts = num_experts
        self._bias: dict[str, dict[int, object]] = {}

    def add(self, name: str, tensor) -> list[tuple[str, object]]:
        """``[(stored name, tensor)]`` ready to write after ``name`` arrived (possibly none)."""
        import torch

        m = _MODAL.match(name)
        if m is None:
            return [(name, tensor)]
        mlp, vision, rest = m["mlp"], m["part"] == "vision_moe", m["rest"]
        if rest == "gate.weight":
            return [(f"{mlp}gate.weight{'_1' if vision else ''}", tensor.t().contiguous())]
        if rest == "gate.e_score_correction_bias":
            rows = self._bias.setdefault(mlp, {})
            rows[int(vision)] = tensor
            if len(rows) < 2:
                return []
            del self._bias[mlp]
            return [(f"{mlp}moe_statics.e_score_correction_bias", torch.stack([rows[0], rows[1]]))]
        expert = re.match(r"^experts\.(\d+)\.(.+)$", rest)
        if expert is None:
            raise ValueError(f"internal: no stored name for {name!r}")
        k = int(expert[1]) + (self.num_experts if vision else 0)
        return [(f"{mlp}experts.{k}.{expert[2]}", tensor)]

    def close(self) -> None:
        """Raise unless every layer's biases were written."""
        if self._bias:
            from loong_core.errors import CheckpointError

            raise CheckpointError(f"internal: expert-score biases left incomplete: {sorted(self._bias)}")
