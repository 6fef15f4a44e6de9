"""The ``loong train`` command that starts a run from a converted checkpoint, as printed by
``loong convert hf-to-loong`` (it composes and validates as printed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

#: Smallest vocabulary the built-in text data can train (byte-level BPE).
_MIN_TEXT_VOCAB = 258


def _flat(prefix: str, value, out: dict) -> dict:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flat(f"{prefix}.{key}", sub, out)
    else:
        out[prefix] = value
    return out


def _format(value) -> str:
    if isinstance(value, (list, dict)) or value is None:
        return json.dumps(value, separators=(",", ":"))
    return str(value).lower() if isinstance(value, bool) else str(value)


def _model_overrides(model: dict, config_class) -> list[str]:
    """``model=OPTION model.key=value ...``: the ``model`` group option of this family that needs
    the fewest extra keys to describe ``model`` exactly."""
    from loong_core.config.compose import list_group_options

    defaults = _flat("model", dataclasses.asdict(config_class()), {})
    wanted = _flat("model", model, {})
    best: tuple[int, str, list[str]] | None = None
    for option in list_group_options():
        if option.group != "model":
            continue
        data = yaml.safe_load(Path(option.path).read_text()) or {}
        if data.get("name") != model["name"] or "defaults" in data:
            continue
        base = {**defaults, **_flat("model", data, {})}
        diffs = [f"{k}={_format(v)}" for k, v in wanted.items()
                 if k != "model.name" and base.get(k) != v]
        if best is None or len(diffs) < best[0]:
            best = (len(diffs), option.option, diffs)
    if best is None:  # no YAML of this family: name it and give every field
        return [f"model.name={model['name']}"] + [f"{k}={_format(v)}" for k, v in wanted.items()
                                                  if k != "model.name" and defaults.get(k) != v]
    return [f"model={best[1]}", *best[2]]


def _data_overrides(model: dict, checkpoint: Path) -> list[str]:
    """Data settings that fit the model: its tokenizer when the checkpoint carries one, else a
    trained vocabulary of the model's size; sequences no longer than its positions."""
    from loong_core.config.compose import compose_raw

    data = compose_raw([]).get("data") or {}
    out = []
    tokenizer = checkpoint / "hf_files" / "tokenizer.json"
    if data.get("name") == "text":
        if tokenizer.is_file():
            out.append(f"data.tokenizer_file={tokenizer}")
        elif model.get("vocab_size") and model["vocab_size"] >= _MIN_TEXT_VOCAB:
            out.append(f"data.vocab_size={model['vocab_size']}")
    max_positions = model.get("max_position_embeddings")
    if max_positions and data.get("seq_length", 0) > max_positions:
        out.append(f"data.seq_length={max_positions}")
    return out


def train_command(checkpoint: str | Path, config_class) -> list[str]:
    """The overrides of ``loong train`` that start from ``checkpoint`` with its exact model.

    Args:
        checkpoint: A converted checkpoint (its completion record names the model).
        config_class: The family's model config class.
    """
    checkpoint = Path(checkpoint)
    model = json.loads((checkpoint / "loong_complete.json").read_text())["model"]
    return [*_model_overrides(model, config_class), *_data_overrides(model, checkpoint),
            f"trainer.init_from={checkpoint}"]
