"""The base of the composed VLMs' HF adapters: config.json with ``text_config`` /
``vision_config`` sub-configs, fields set part by part (encoder, projector, foundation)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from loong_core.errors import ConfigError
from loong_llm.hf.adapter import HFAdapter, read_hf_config


def text_hf_name(name: str) -> str:
    """A ``<Text>ForCausalLM`` tensor name inside a composed HF model (``model.*`` ->
    ``model.language_model.*``; ``lm_head`` stays)."""
    return "model.language_model." + name[len("model."):] if name.startswith("model.") else name


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
