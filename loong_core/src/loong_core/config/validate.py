"""Check a composed config (plain dicts) against typed dataclasses, with errors a user can act on."""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from loong_core.config.rules import at_most, check_finite, check_name, check_writable_dir, divisible
from loong_core.config.schema import DataConfig, LoongConfig, ModelConfig
from loong_core.errors import ConfigError, PluginError
from loong_core.plugins.registry import Registry, did_you_mean

_NONE = type(None)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return f"list[{_type_name(item)}]"
    if tp is _NONE:
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, path: str, registry: Registry | None = None) -> Any:
    """Return ``value`` checked (and losslessly converted) against type ``tp``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and _NONE in args:
            return None
        errors = []
        for arg in args:
            if arg is _NONE:
                continue
            try:
                return _coerce(value, arg, path, registry)
            except ConfigError as exc:
                errors.append(exc)
        raise ConfigError(f"'{path}' = {value!r} is not a {_type_name(tp)}.")
    if origin is Literal:
        choices = list(typing.get_args(tp))
        if value not in choices:
            raise ConfigError(
                f"'{path}' = {value!r} is not allowed.{did_you_mean(value, choices)} "
                f"Choices: {', '.join(map(str, choices))}."
            )
        return value
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"'{path}' = {value!r} must be a list of {_type_name(item)}.")
        return [_coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"'{path}' = {value!r} must be a mapping.")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, path, registry)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            check_finite(float(value), path)
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif isinstance(value, tp):
        return value
    raise ConfigError(
        f"'{path}' = {value!r} has type {type(value).__name__}; expected {_type_name(tp)}."
    )


def build_dataclass(cls: type, data: Any, path: str, registry: Registry | None = None) -> Any:
    """Build ``cls`` from a mapping, rejecting unknown keys and wrong types.

    Args:
        cls: Target dataclass.
        data: Mapping of field values (missing fields take their defaults).
        path: Dotted config path of ``data`` (for messages).
        registry: When given, fields marked ``registered(kind)`` must name a registered entry.

    Raises:
        ConfigError: naming the bad key, the valid choices and a did-you-mean.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"'{path}' must be a mapping of {cls.__name__} fields, got {data!r}.")
    def sub(key: str) -> str:
        return f"{path}.{key}" if path else key

    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            valid = sorted(fields)
            raise ConfigError(
                f"Unknown key '{sub(key)}' for {cls.__name__}.{did_you_mean(key, valid)} "
                f"Valid keys: {', '.join(valid)}."
            )
    kwargs = {}
    for name, f in fields.items():
        key_path = sub(name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"Missing required key '{key_path}' ({_type_name(hints[name])}).")
            continue
        value = data[name]
        if value == "???":
            raise ConfigError(f"Missing value for '{key_path}': set it in YAML or as {key_path}=...")
        component_kind = f.metadata.get("component")
        if component_kind and registry is not None:
            base = f.metadata.get("component_base") or ModelConfig
            kwargs[name] = _component(value, base, component_kind, key_path, registry)
            continue
        value = _coerce(value, hints[name], key_path, registry)
        bounds = f.metadata.get("bounds")
        if bounds is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            bounds.check(value, key_path)
        kind = f.metadata.get("registry")
        # An empty name is refused too where the field has a real default (engine, balancer).
        if registry is not None and kind and (value or f.default not in ("", None)):
            try:
                registry.get(kind, value, key_path)
            except PluginError as exc:
                raise ConfigError(str(exc)) from None
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (ValueError, ArithmeticError) as exc:  # a config class's own __post_init__ check
        raise ConfigError(f"'{path or cls.__name__}': {exc}") from None


def _component(section: dict, base: type, kind: str, path: str, registry: Registry) -> Any:
    if not isinstance(section, dict) or not section.get("name"):
        choices = registry.names(kind)
        raise ConfigError(
            f"'{path}.name' is not set: choose a {kind} with {path}=<option> or {path}.name=... "
            f"Installed: {', '.join(choices) or 'none'}."
        )
    try:
        entry = registry.get(kind, section["name"], f"{path}.name")
    except PluginError as exc:
        raise ConfigError(str(exc)) from None
    cls = entry.load_meta("config") or base
    if not issubclass(cls, base):
        raise ConfigError(f"{kind} '{entry.name}' declares config {cls} not derived from {base}.")
    return build_dataclass(cls, section, path, registry)


def validate_config(raw: dict, registry: Registry) -> LoongConfig:
    """Turn the composed config into a :class:`LoongConfig`, or raise :class:`ConfigError`."""
    raw = dict(raw)
    model = raw.pop("model", None)
    data = raw.pop("data", None)
    cfg = build_dataclass(LoongConfig, raw, "", registry)
    cfg.model = _component(model, ModelConfig, "model", "model", registry)
    cfg.data = _component(data, DataConfig, "dataset", "data", registry)
    _check_consistency(cfg, registry)
    return cfg


def _check_consistency(cfg: LoongConfig, registry: Registry) -> None:
    """Rules between keys (each field's own range was checked when it was built)."""
    p, t, o = cfg.parallel, cfg.trainer, cfg.optim
    check_name(cfg.name, "name")
    divisible(t.global_batch_size, "trainer.global_batch_size", t.micro_batch_size,
              "trainer.micro_batch_size", "the quotient is the gradient accumulation")
    at_most(o.min_lr, "optim.min_lr", o.lr, "optim.lr", "the schedule decays from lr to min_lr")
    if p.sequence_parallel and p.tensor_model_parallel_size == 1:
        raise ConfigError("'parallel.sequence_parallel=true' needs tensor_model_parallel_size > 1.")
    if p.virtual_pipeline_model_parallel_size and p.pipeline_model_parallel_size < 2:
        raise ConfigError(
            "'parallel.virtual_pipeline_model_parallel_size' = "
            f"{p.virtual_pipeline_model_parallel_size} needs pipeline_model_parallel_size > 1; "
            "set parallel.virtual_pipeline_model_parallel_size=null or raise the pipeline size.")
    if p.recompute_method and p.recompute_granularity != "full":
        raise ConfigError("'parallel.recompute_method' applies only with recompute_granularity=full.")
    if p.recompute_granularity == "full" and (p.recompute_method is None or p.recompute_num_layers is None):
        missing = [k for k in ("recompute_method", "recompute_num_layers") if getattr(p, k) is None]
        raise ConfigError(
            f"parallel.recompute_granularity=full needs {' and '.join('parallel.' + k for k in missing)} "
            "(which layers to recompute): e.g. parallel.recompute_method=uniform "
            "parallel.recompute_num_layers=1 (every layer its own recompute unit).")
    if p.recompute_granularity == "selective" and p.recompute_num_layers is not None:
        raise ConfigError("'parallel.recompute_num_layers' applies only with recompute_granularity=full "
                          "(selective recompute picks modules, not layers); set it to null.")
    if cfg.device.name != "auto" and not registry.has("device", cfg.device.name):
        try:
            registry.get("device", cfg.device.name, "device.name")
        except PluginError as exc:
            raise ConfigError(str(exc)) from None
    if t.resume not in ("none", "auto") and not t.resume:
        raise ConfigError("'trainer.resume' must be 'none', 'auto' or a checkpoint directory.")
    if 0 < t.straggler_factor <= 1:
        raise ConfigError(f"'trainer.straggler_factor' = {t.straggler_factor} would name ranks no slower "
                          "than the others; use a ratio above 1 (e.g. 1.5) or 0 to turn the check off.")
    if t.profile:
        _check_profile(t)
    from loong_core.kernels.resolve import check_names

    check_names(dataclasses.asdict(cfg.kernels), registry)
    from loong_core.config.ulysses_rules import check_ulysses

    check_ulysses(cfg)
    from loong_core.config.sequence_chunks_rules import check_sequence_chunks

    check_sequence_chunks(cfg)
    from loong_core.config.fp8_rules import check_fp8

    check_fp8(cfg)
    cfg.model.check(cfg, "model")


def _check_profile(t) -> None:
    """``trainer.profile``: a non-empty step range inside the run, ranks that exist as numbers."""
    if t.profile_step_end <= t.profile_step_start:
        raise ConfigError(f"'trainer.profile_step_end' = {t.profile_step_end} must be above "
                          f"trainer.profile_step_start = {t.profile_step_start} (the steps recorded are "
                          f"start up to, not including, end); e.g. trainer.profile_step_end="
                          f"{t.profile_step_start + 2}.")
    if t.profile_step_start > t.train_iters:
        raise ConfigError(f"'trainer.profile_step_start' = {t.profile_step_start} is after the last step "
                          f"(trainer.train_iters = {t.train_iters}), so nothing would be recorded; pick "
                          f"steps within 1..{t.train_iters}, e.g. trainer.profile_step_start="
                          f"{max(1, t.train_iters - 1)} trainer.profile_step_end={t.train_iters + 1}.")
    if not t.profile_ranks or any(r < 0 for r in t.profile_ranks):
        raise ConfigError(f"'trainer.profile_ranks' = {list(t.profile_ranks)}: list the global ranks that "
                          "record (0 and up), e.g. trainer.profile_ranks=[0].")


def check_writable_paths(cfg: LoongConfig) -> None:
    """The run directory and the data cache can be written (checked by ``loong train`` before
    anything starts; not by commands that only read a run, which may sit on a read-only disk).

    Raises:
        ConfigError: naming the key, the folder and why it cannot be written.
    """
    t = cfg.trainer
    if t.run_dir:
        check_writable_dir(t.run_dir, "trainer.run_dir", "run", subfolders=("checkpoints",))
    else:
        check_writable_dir(Path(os.environ.get("LOONG_RUNS", "runs")) / cfg.name,
                           "$LOONG_RUNS (or ./runs) / name", "run")
    cache = cfg.data.cache_dir or os.environ.get("LOONG_CACHE") or Path.home() / ".cache" / "loong"
    check_writable_dir(cache, "data.cache_dir" if cfg.data.cache_dir else "$LOONG_CACHE", "data cache")
