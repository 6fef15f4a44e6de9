"""Models built from diffusers' own classes: the module *is* the diffusers model, so its
``state_dict`` (and every loong checkpoint of it) uses the diffusers names unchanged."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from loong_core.errors import MissingDependencyError
from loong_diffusion.provider import DiffusionProvider


def import_class(target: str) -> type:
    """``"module:Class"`` -> the class, with the pip command when diffusers is missing."""
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError:
        raise MissingDependencyError(module.split(".")[0], "diffusers>=0.35", target) from None


def diffusers_kwargs(config: Any, loong_fields: type) -> dict:
    """The config's fields that are constructor arguments of the diffusers class (lists -> tuples)."""
    skip = {f.name for f in dataclasses.fields(loong_fields)} | {"pretrained"}
    kwargs = {}
    for f in dataclasses.fields(config):
        if f.name not in skip:
            value = getattr(config, f.name)
            kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    return kwargs


def load_diffusers_dir(cls: type, directory: str) -> Any:
    """Build ``cls`` from ``directory/config.json`` and load its safetensors strictly.

    Weights keep their names; they are copied into the fp32 parameters (published bf16 weights
    become fp32 master weights). No accelerate, no hub access.
    """
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors next to config.json (a diffusers model folder?)")
    model = cls.from_config(cls.load_config(str(directory)))
    state = {}
    for file in files:
        state.update(load_file(str(file)))
    model.load_state_dict(state, strict=True)
    return model


class DiffusersProvider(DiffusionProvider):
    """Builds ``model_class`` from the config's diffusers fields, or loads ``config.pretrained``.

    Attributes:
        model_class: ``"diffusers:ClassName"``.
        block_attr: Attribute of the model holding its transformer blocks.
    """

    model_class: str = ""
    block_attr: str = "blocks"

    def diffusers_kwargs(self) -> dict:
        from loong_diffusion.config import DiffusionModelConfig

        return diffusers_kwargs(self.config, DiffusionModelConfig)

    def build_torch_model(self):
        cls = import_class(self.model_class)
        if getattr(self.config, "pretrained", None):
            return load_diffusers_dir(cls, self.config.pretrained)
        return cls(**self.diffusers_kwargs())

    def torch_blocks(self, model) -> list:
        return list(getattr(model, self.block_attr))

    def null_condition(self, condition: dict) -> dict:
        """Empty text: zero embeddings, only the first token unmasked (no fully masked attention)."""
        out = {"text_embeds": condition["text_embeds"].new_zeros(condition["text_embeds"].shape)}
        if "text_mask" in condition:
            mask = condition["text_mask"].new_zeros(condition["text_mask"].shape)
            mask[:, 0] = 1
            out["text_mask"] = mask
        return out
