"""Generated config overrides for the fuzz test and ``benchmarks/config_fuzz.py``.

Keys come from the validated ``llama_debug`` config itself (every leaf key, including keys other
plugins add), values from pools chosen per type that mix meaningful values with edge cases (zero,
negatives, NaN/inf, path escapes). :func:`known_invalid` states, independently of the validator,
rules a correct validator must enforce; the fuzz asserts them.
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

BASE = ["experiment=llama_debug"]

INTS = [-5, -1, 0, 1, 2, 3, 4, 5, 7, 8, 16, 64, 100, 4096, 2 ** 40]
FLOATS = [-1.0, -1e-3, 0.0, 1e-8, 1e-3, 0.1, 0.5, 0.9, 0.999, 1.0, 1.5, 7.0, 100.0, 1e30,
          math.nan, math.inf, -math.inf]
STRINGS = ["", "abc", "../../escape", "a b", "x/y", "none", "auto", "ddp"]
BOOLS = [True, False]


@lru_cache(maxsize=1)
def leaf_keys() -> dict[str, object]:
    """``dotted key -> default value`` of every leaf of the validated base config."""
    from loong_core.config.compose import load_config

    tree = dataclasses.asdict(load_config(BASE))
    leaves: dict[str, object] = {}

    def walk(prefix: str, node) -> None:
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict):
                walk(path, value)
            else:
                leaves[path] = value

    walk("", tree)
    # Names are validated against registries; fuzzing them only tests did-you-mean.
    for key in ("model.name", "data.name"):
        leaves.pop(key, None)
    return leaves


def value_pool(default) -> list:
    """Candidate values for a key whose default is ``default``."""
    if isinstance(default, bool):
        return BOOLS + [2, "maybe"]
    if isinstance(default, int):
        return INTS + [0.5]
    if isinstance(default, float):
        return FLOATS
    if isinstance(default, str):
        return STRINGS + [default]
    if isinstance(default, list):
        return [[], [1, 2], default]
    return INTS[:8] + FLOATS[:6] + STRINGS[:3] + [None]


def format_value(value) -> str:
    """A value as a user types it on the command line (Hydra override grammar)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, str):
        return f"'{value}'" if value == "" or " " in value else value
    return str(value)


def override(key: str, value) -> str:
    """``key=value`` in the override grammar."""
    return f"{key}={format_value(value)}"


@lru_cache(maxsize=1)
def _base_raw() -> dict:
    from loong_core.config.compose import compose_raw

    return compose_raw(BASE)


def validate_fast(overrides: list[str]):
    """``load_config(BASE + overrides)`` without re-running Hydra's composition for each call:
    the overrides are parsed by Hydra's override grammar and set on a copy of the composed base
    tree, which is then validated (the fuzz runs a thousand of these in seconds)."""
    import copy

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from loong_core.config.validate import validate_config
    from loong_core.plugins import get_plugin_system

    raw = copy.deepcopy(_base_raw())
    parser = OverridesParser.create()
    for item in overrides:
        parsed = parser.parse_override(item)
        *parents, leaf = parsed.key_or_group.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = parsed.value()
    return validate_config(raw, get_plugin_system().registry())


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: key -> predicate over the new value that is True when the value alone is invalid.
SINGLE_KEY_RULES = {
    "optim.lr": lambda v: not (v >= 0 and math.isfinite(v)),
    "optim.min_lr": lambda v: not (0 <= v <= 0.003),
    "optim.adam_beta1": lambda v: not (0 <= v < 1),
    "optim.adam_beta2": lambda v: not (0 <= v < 1),
    "optim.adam_eps": lambda v: not (0 < v < math.inf),
    "optim.weight_decay": lambda v: not (0 <= v < math.inf),
    "optim.clip_grad": lambda v: not (0 <= v < math.inf),
    "optim.lr_warmup_iters": lambda v: v < 0,
    "trainer.train_iters": lambda v: v < 1,
    "trainer.micro_batch_size": lambda v: v < 1 or 8 % v,
    "trainer.global_batch_size": lambda v: v < 1 or v % 2,
    "trainer.log_interval": lambda v: v < 1,
    "trainer.eval_interval": lambda v: v < 0,
    "trainer.eval_iters": lambda v: v < 0,
    "trainer.save_interval": lambda v: v < 0,
    "model.num_layers": lambda v: v < 1,
    "model.hidden_size": lambda v: v < 1 or v % 4,
    "model.num_attention_heads": lambda v: v < 1 or v % 2 or 64 % v,
    "model.num_query_groups": lambda v: v is not None and (v < 1 or 4 % v),
    "model.ffn_hidden_size": lambda v: v is not None and v < 1,
    "model.make_vocab_size_divisible_by": lambda v: v < 1,
    "model.max_position_embeddings": lambda v: v < 64,
    "model.norm_epsilon": lambda v: not (0 < v < math.inf),
    "model.hidden_dropout": lambda v: not (0 <= v < 1),
    "model.attention_dropout": lambda v: not (0 <= v < 1),
    "model.init_method_std": lambda v: not (0 < v < math.inf),
    "model.rotary_base": lambda v: not (0 < v < math.inf),
    "data.seq_length": lambda v: v < 1 or v > 512,
    "parallel.tensor_model_parallel_size": lambda v: v < 1,
    "parallel.pipeline_model_parallel_size": lambda v: v < 1,
    "parallel.context_parallel_size": lambda v: v < 1,
    "parallel.expert_model_parallel_size": lambda v: v < 1,
    "device.num_threads": lambda v: v is not None and v < 1,
    "name": lambda v: not v or "/" in v or ".." in v or " " in v,
}


def known_invalid(pairs: list[tuple[str, object]]) -> str | None:
    """The first key of ``pairs`` whose value breaks a rule of :data:`SINGLE_KEY_RULES`
    (applied only when that key is the one override of its kind), or None."""
    keys = [k for k, _ in pairs]
    for key, value in pairs:
        rule = SINGLE_KEY_RULES.get(key)
        if rule is None or keys.count(key) > 1 or len(set(keys)) > 1:
            continue
        if key == "name":
            if isinstance(value, str) and rule(value):
                return key
            continue
        if value is None and key not in ("model.num_query_groups", "model.ffn_hidden_size",
                                          "device.num_threads"):
            continue
        if value is not None and not _number(value):
            continue
        if rule(value):
            return key
    return None
