"""Compose a run's config with Hydra's compose API over core's and every plugin's config folders."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from loong_core.config.schema import LoongConfig
from loong_core.config.validate import validate_config
from loong_core.errors import ConfigError
from loong_core.plugins import get_plugin_system
from loong_core.plugins.registry import did_you_mean

GROUPS = ("model", "data", "parallel", "optim", "trainer", "device", "kernels", "experiment")
PRIMARY = "config"


@dataclass
class GroupOption:
    """One option of a config group and the package whose folder provides it."""

    group: str
    option: str
    package: str
    path: str


def resolve_search_path(entry: str) -> Path | None:
    """Turn ``pkg://a.b`` / ``file://dir`` into a directory (None if it does not exist)."""
    if entry.startswith("pkg://"):
        try:
            path = Path(str(resources.files(entry[len("pkg://"):])))
        except ModuleNotFoundError:
            return None
    elif entry.startswith("file://"):
        path = Path(entry[len("file://"):])
    else:
        path = Path(entry)
    return path if path.is_dir() else None


def list_group_options() -> list[GroupOption]:
    """Every option of every group over all plugins' search paths (no Hydra, no torch)."""
    options = []
    for entry in get_plugin_system().config_search_path():
        root = resolve_search_path(entry)
        if root is None:
            continue
        package = entry.split("://", 1)[-1].split(".")[0]
        for group_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            for yaml_file in sorted(group_dir.rglob("*.yaml")):
                option = yaml_file.relative_to(group_dir).with_suffix("").as_posix()
                options.append(GroupOption(group_dir.name, option, package, str(yaml_file)))
    return options


def default_experiment() -> str | None:
    """The experiment plugins offer for a bare ``loong train`` (highest priority wins)."""
    entries = get_plugin_system().registry().entries("default_experiment")
    if not entries:
        return None
    return max(entries, key=lambda e: (e.meta.get("priority", 0), e.name)).name


def _check_group_overrides(overrides: list[str]) -> None:
    options = list_group_options()
    by_group: dict[str, list[str]] = {}
    for opt in options:
        by_group.setdefault(opt.group, []).append(opt.option)
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.lstrip("+~")
        if not sep or key not in GROUPS or "." in key:
            continue
        choices = by_group.get(key, [])
        if value not in choices:
            raise ConfigError(
                f"Unknown option '{value}' for config group '{key}'.{did_you_mean(value, choices)} "
                f"Available: {', '.join(sorted(choices)) or 'none'} (see `loong config groups`)."
            )


_KEY = re.compile(r"(~|\+\+?)?[A-Za-z_]\w*([./]\w+)*(@[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?")


def check_override_syntax(overrides: list[str]) -> None:
    """Each override is ``key=value``, ``group=option``, ``group@package=option`` or ``~key``.

    Raises:
        ConfigError: naming the malformed override and the forms that work.
    """
    for item in overrides:
        key, sep, _ = item.partition("=")
        if _KEY.fullmatch(key) and (sep or key.startswith("~")):
            continue
        raise ConfigError(
            f"Override {item!r} is not key=value: write a dotted key, '=' and a value, for "
            "example trainer.train_iters=100, model=llama_tiny, model@model.foundation=qwen3_debug "
            "or ~key to delete one."
        )


def _force(override: str) -> str:
    """``key=value`` -> ``++key=value`` for plain keys, so that a misspelt key reaches the
    validator (which names it with a did-you-mean) instead of failing inside Hydra. Group
    choices with a package or a nested group (``model@model.foundation=qwen3_debug``,
    ``model/encoder@model.encoder=vit_tiny``) stay as they are."""
    key, sep, _ = override.partition("=")
    if not sep or key[:1] in "+~" or key in GROUPS or key.startswith("hydra."):
        return override
    if "@" in key or "/" in key:  # a config-group choice (`group@package=option`), not a key
        return override
    return "++" + override


def compose_raw(overrides: list[str] | None = None) -> dict:
    """Compose the YAML tree for ``overrides`` (Hydra syntax) and return it as plain dicts.

    When no ``experiment=`` override is given, the default experiment offered by the installed
    plugins is used.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides or [])
    if not any(o.split("=", 1)[0].lstrip("+~") == "experiment" for o in overrides):
        default = default_experiment()
        if default:
            overrides.insert(0, f"experiment={default}")
    check_override_syntax(overrides)
    _check_group_overrides(overrides)
    overrides = [_force(o) for o in overrides]
    extra = [p for p in get_plugin_system().config_search_path() if p != "pkg://loong_core.conf"]
    if extra:
        overrides.append(f"hydra.searchpath=[{','.join(extra)}]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="loong_core.conf", version_base="1.3"):
            cfg = compose(config_name=PRIMARY, overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"Could not compose the config: {exc}") from None
    finally:
        GlobalHydra.instance().clear()
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"Could not resolve the config: {exc}") from None


def load_config(overrides: list[str] | None = None) -> LoongConfig:
    """Compose and validate: the typed config of a run."""
    raw = compose_raw(overrides)
    return validate_config(raw, get_plugin_system().registry())


def cache_root(data_cache_dir: str | None = None) -> Path:
    """Directory for prepared data and measured machine facts."""
    if data_cache_dir:
        return Path(data_cache_dir)
    return Path(os.environ.get("LOONG_CACHE", Path.home() / ".cache" / "loong"))
