"""The base of the composed VLMs' HF adapters: config.json with ``text_config`` /
``vision_config`` sub-configs, fields set part by part (encoder, projector, foundation)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from loong_core.errors import ConfigError
from loong_llm.hf.adapter import HFAdapter, read_hf_config
from loong_llm.hf.mapping import Rule, RuleSet


def text_config(hf: dict) -> dict:
    """A copy of ``hf["text_config"]`` whose ``tie_word_embeddings`` is the top-level key when
    there is one (transformers ties a composed model by it; the sub-config may keep its own
    default)."""
    text = dict(hf.get("text_config") or {})
    text["tie_word_embeddings"] = hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return text


def text_hf_name(name: str) -> str:
    """A ``<Text>ForCausalLM`` tensor name inside a composed HF model (``model.*`` ->
    ``model.language_model.*``; ``lm_head`` stays)."""
    return "model.language_model." + name[len("model."):] if name.startswith("model.") else name


class PartsRuleSet:
    """Rule sets of several model parts behind one :class:`RuleSet` interface (``match``,
    ``export_names``, ``to_loong``, ``to_hf``, ``shard``); each rule is transformed by the part it belongs to."""

    def __init__(self, parts: list[RuleSet]):
        self.parts = parts
        self.rules = [rule for part in parts for rule in part.rules]
        self._owner = {rule: part for part in parts for rule in part.rules}

    def match(self, loong_name: str, experts: range | None = None) -> tuple[Rule, list[str]]:
        """The rule of ``loong_name`` and its concrete HF names (a stacked expert rule's for
        ``experts``, see :meth:`RuleSet.match`); KeyError when none matches."""
        for part in self.parts:
            try:
                return part.match(loong_name, experts)
            except KeyError:
                continue
        raise KeyError(loong_name)

    def export_names(self, loong_name: str) -> tuple[Rule, list[str]]:
        """Like :meth:`match`, with the rule's ``also`` copies (see :meth:`RuleSet.export_names`)."""
        rule, _ = self.match(loong_name)
        return self._owner[rule].export_names(loong_name)

    def to_loong(self, rule: Rule, tensors: list, rows: int | None = None):
        """Full loong tensor of ``rule`` from its HF tensors."""
        return self._owner[rule].to_loong(rule, tensors, rows)

    def to_hf(self, rule: Rule, full) -> list:
        """HF tensors of ``rule`` from the full loong tensor."""
        return self._owner[rule].to_hf(rule, full)

    shard = staticmethod(RuleSet.shard)


class VLMHFAdapter(HFAdapter):
    """HF <-> loong for a composed VLM. Subclasses' :meth:`config_from_hf` returns
    ``{"encoder": {...}, "projector": {...}, "foundation": {...}, **top-level fields}`` (any part
    may be missing)."""

    parts = ("encoder", "projector", "foundation")

    def apply_hf_config(self, cfg, hf_dir: str | Path) -> None:
        """Overwrite each part's fields, and the top-level ones, from config.json."""
        hf = read_hf_config(hf_dir)
        self.check_model_type(hf, str(Path(hf_dir) / "config.json"))
        fields = self.config_from_hf(hf)
        for part in self.parts:
            if part not in fields:
                continue
            target = getattr(cfg, part)
            known = {f.name for f in dataclasses.fields(target)}
            for key, value in fields.pop(part).items():
                if key not in known:
                    raise ConfigError(f"internal: {type(target).__name__} has no field {key!r}")
                setattr(target, key, value)
        for key, value in fields.items():
            if not hasattr(cfg, key):
                raise ConfigError(f"internal: {type(cfg).__name__} has no field {key!r}")
            setattr(cfg, key, value)

    def full_hf_config(self, cfg, base: dict | None, dtype: str) -> dict:
        """The source config.json (sub-configs merged key by key) updated with loong's fields."""
        base = dict(base or {})
        out = super().full_hf_config(cfg, base, dtype)
        for sub in ("text_config", "vision_config"):
            out[sub] = {**(base.get(sub) or {}), **out[sub]}
            out[sub].pop("torch_dtype", None)
        return out
