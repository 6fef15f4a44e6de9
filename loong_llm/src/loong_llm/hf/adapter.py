"""Base of the per-family HF checkpoint adapters: config translation and the mapping table."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from loong_core.errors import CheckpointError, ConfigError
from loong_llm.hf.mapping import Rule, RuleSet, Shape

logger = logging.getLogger(__name__)


def read_hf_config(hf_dir: str | Path) -> dict:
    """``config.json`` of an HF model directory."""
    path = Path(hf_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise CheckpointError(f"{hf_dir} is not a Hugging Face model directory: cannot read "
                              f"{path} ({exc}).") from None


class HFAdapter:
    """Translates one family between HF (``config.json`` + safetensors) and loong.

    Subclasses set ``family``, ``model_types`` and ``architecture`` and extend
    :meth:`config_from_hf`, :meth:`config_to_hf` and :meth:`rules`.

    Attributes:
        family: Registered model name (``loong plugins``).
        model_types: HF ``model_type`` values this adapter reads (the first is written).
        architecture: HF ``architectures[0]`` written on export.
        aliases: Config keys transformers may save under another name (kept as the source had).
    """

    family = ""
    model_types: tuple[str, ...] = ()
    architecture = ""
    aliases: dict[str, str] = {}  # key written -> another name transformers may save it under

    # -- config ----------------------------------------------------------------------------
    def check_model_type(self, hf: dict, where: str) -> None:
        """Refuse a config.json of another family."""
        model_type = hf.get("model_type")
        if model_type not in self.model_types:
            raise ConfigError(
                f"{where} has model_type {model_type!r}, which the '{self.family}' family does not "
                f"read (it reads: {', '.join(self.model_types)}). Pick the family matching it.")

    def config_from_hf(self, hf: dict) -> dict[str, Any]:
        """Loong model fields (``DecoderConfig`` names) from an HF config dict."""
        raise NotImplementedError

    def config_to_hf(self, cfg) -> dict[str, Any]:
        """HF config dict (without ``architectures`` / ``model_type``) from a loong config."""
        raise NotImplementedError

    def apply_hf_config(self, cfg, hf_dir: str | Path) -> None:
        """Overwrite ``cfg``'s architecture fields with those of ``hf_dir/config.json``."""
        hf = read_hf_config(hf_dir)
        self.check_model_type(hf, str(Path(hf_dir) / "config.json"))
        for key, value in self.config_from_hf(hf).items():
            if not hasattr(cfg, key):
                raise ConfigError(f"internal: {type(cfg).__name__} has no field {key!r}")
            setattr(cfg, key, value)
        logger.info("model architecture taken from %s/config.json (%s)", hf_dir, self.family)

    def full_hf_config(self, cfg, base: dict | None, dtype: str) -> dict:
        """The config.json to write: ``base`` (the source config.json, if known) updated with
        the fields the loong config determines."""
        out = dict(base or {})
        out.update(self.config_to_hf(cfg))
        for key, alias in self.aliases.items():  # keep the source's spelling of a key
            if alias in (base or {}) and key not in (base or {}) and key in out:
                out[alias] = out.pop(key)
        out["architectures"] = [self.architecture]
        out["model_type"] = self.model_types[0]
        out["dtype"] = dtype
        out.pop("torch_dtype", None)
        return out

    # -- tensors ---------------------------------------------------------------------------
    def rules(self, cfg) -> list[Rule]:
        """The mapping table of a model with config ``cfg``."""
        raise NotImplementedError

    def rule_set(self, cfg) -> RuleSet:
        """Rules plus the shapes the transforms need."""
        shape = Shape(num_heads=cfg.num_attention_heads,
                      num_groups=cfg.num_query_groups or cfg.num_attention_heads,
                      head_dim=cfg.head_dim(), vocab_size=cfg.vocab_size,
                      rope_dim=getattr(cfg, "qk_pos_emb_head_dim", 0),
                      num_experts=getattr(cfg, "num_experts", 0) or 0)
        return RuleSet(self.rules(cfg), shape)

    def export_stacker(self, cfg):
        """What regroups the HF tensors the rules make before they are written (an
        :class:`~loong_llm.hf.stacked_experts.ExpertStacker` for checkpoints that stack their
        experts), or None: every tensor is written as the rules make it."""
        return None
