"""Value rules of config fields and helpers for cross-key rules, with messages a user acts on.

A field declares its range where it is declared::

    num_layers: int = positive(4)
    hidden_dropout: float = probability(0.0)
    lr: float = bounded(3e-4, ge=0)

:func:`loong_core.config.validate.build_dataclass` checks the range after the type (every float
must also be finite). Cross-key rules (divisibility, ``min_lr <= lr``) use :func:`divisible` and
:func:`multiple_of`, whose messages name both keys, the rule and the nearest valid values.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from loong_core.errors import ConfigError


@dataclass(frozen=True)
class Bounds:
    """An interval a number must lie in (None: unbounded on that side)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def describe(self) -> str:
        """The rule in words: ``>= 0``, ``in [0, 1)``."""
        low = f"[{self.ge:g}" if self.ge is not None else (f"({self.gt:g}" if self.gt is not None else None)
        high = f"{self.le:g}]" if self.le is not None else (f"{self.lt:g})" if self.lt is not None else None)
        if low and high:
            return f"in {low}, {high}"
        if low:
            return (">= " if low[0] == "[" else "> ") + low[1:]
        if high:
            return ("<= " if high[-1] == "]" else "< ") + high[:-1]
        return "any number"

    def check(self, value: float, path: str) -> None:
        """Raise :class:`ConfigError` naming ``path`` when ``value`` is outside."""
        ok = ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
              and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))
        if not ok:
            raise ConfigError(f"'{path}' = {value!r} must be {self.describe()}.")


def bounded(default, *, ge=None, gt=None, le=None, lt=None, **kwargs):
    """A numeric field whose value (when not None) must lie in the given interval."""
    metadata = {**kwargs.pop("metadata", {}), "bounds": Bounds(ge, gt, le, lt)}
    return field(default=default, metadata=metadata, **kwargs)


def positive(default, **kwargs):
    """A count or size: ``>= 1`` for ints, ``> 0`` for floats."""
    return bounded(default, gt=0, **kwargs)


def non_negative(default, **kwargs):
    """``>= 0`` (0 usually means off)."""
    return bounded(default, ge=0, **kwargs)


def probability(default, **kwargs):
    """A dropout-like probability in ``[0, 1)`` (1 would drop everything)."""
    return bounded(default, ge=0, lt=1, **kwargs)


def check_finite(value: float, path: str) -> None:
    """Every float of a config is finite (NaN / inf are never a meaningful setting)."""
    if not math.isfinite(value):
        raise ConfigError(f"'{path}' = {value!r} must be a finite number.")


def divisors_near(n: int, value: int, count: int = 3) -> list[int]:
    """Up to ``count`` divisors of ``n`` closest to ``value`` (ascending)."""
    divisors = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    divisors = sorted(set(divisors + [n // d for d in divisors]))
    return sorted(sorted(divisors, key=lambda d: (abs(d - value), d))[:count])


def multiples_near(m: int, value: int) -> list[int]:
    """The multiples of ``m`` just below (if positive) and above ``value``."""
    low = value // m * m
    return [v for v in (low, low + m) if v > 0 and v != value] or [m]


def _alternatives(values: list[int]) -> str:
    values = [str(v) for v in values]
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def divisible(value: int, value_key: str, divisor: int, divisor_key: str, why: str = "") -> None:
    """Require ``value % divisor == 0``; the message offers the nearest valid value of each key.

    Args:
        value: The number that must be a multiple (e.g. ``num_attention_heads``).
        value_key: Its config key.
        divisor: The number that must divide it (e.g. ``tensor_model_parallel_size``).
        divisor_key: Its config key (or a description such as ``--nproc-per-node``).
        why: What needs the rule, appended in parentheses.
    """
    if divisor > 0 and value % divisor == 0:
        return
    reason = f" ({why})" if why else ""
    raise ConfigError(
        f"'{value_key}' = {value} must be divisible by '{divisor_key}' = {divisor}{reason}: set "
        f"{value_key}={_alternatives(multiples_near(divisor, value))}, or "
        f"{divisor_key}={_alternatives(divisors_near(value, divisor))}."
    )


def at_most(value: float, value_key: str, limit: float, limit_key: str, why: str = "") -> None:
    """Require ``value <= limit`` for two keys that constrain each other."""
    if value <= limit:
        return
    reason = f" ({why})" if why else ""
    raise ConfigError(
        f"'{value_key}' = {value:g} must be <= '{limit_key}' = {limit:g}{reason}: lower "
        f"{value_key} or raise {limit_key}."
    )


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def check_name(value: str, path: str) -> None:
    """A name used as one path component: letters, digits, ``_ . + -``; no ``..``."""
    if not _SAFE_NAME.fullmatch(value) or ".." in value:
        raise ConfigError(
            f"'{path}' = {value!r} must be one folder name (letters, digits, '_', '.', '+', '-', "
            "starting with a letter or digit, no '..'), for example name=my_run."
        )


def _cannot_write(folder: Path) -> str | None:
    """Why no file can be created in ``folder`` (None: one can). A file is created and removed
    at once: permission bits alone miss a read-only mount, ACLs, root squashed on NFS, and a
    filesystem without a free inode."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    return None if os.access(folder, os.W_OK | os.X_OK) else "permission denied"


def check_writable_dir(directory: str | os.PathLike, path: str, purpose: str,
                       subfolders: tuple[str, ...] = ()) -> None:
    """Require that ``directory`` is (or can be created as) a writable folder, without creating it.

    Args:
        directory: The folder.
        path: Config key (or environment variable) that chose it.
        purpose: What is written there, for the message.
        subfolders: Folders inside ``directory`` that must be writable too when they exist
            (``checkpoints`` of a run directory).
    """
    target = Path(directory).expanduser()
    probe = target
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(
            f"'{path}' = {str(directory)!r}: {probe} is a file, so the {purpose} folder cannot be "
            f"created there; choose another {path}."
        )
    folders = [probe] + [target / name for name in subfolders if (target / name).is_dir()]
    for folder in folders if probe.exists() else []:
        reason = _cannot_write(folder)
        if reason:
            raise ConfigError(
                f"'{path}' = {str(directory)!r}: {folder} is not writable ({reason}), so the "
                f"{purpose} cannot be written there. Make it writable (chmod u+w, or remount the "
                f"filesystem read-write) or choose another {path}."
            )


def check_batch_layout(global_batch: int, micro_batch: int, data_parallel: int, how: str) -> None:
    """Require ``global_batch % (micro_batch * data_parallel) == 0`` and say which key to change.

    Args:
        global_batch: ``trainer.global_batch_size``.
        micro_batch: ``trainer.micro_batch_size``.
        data_parallel: Data-parallel size.
        how: How the data-parallel size came about (``2 ranks / (TP 1 x PP 1 x CP 1)``).
    """
    step = micro_batch * data_parallel
    if global_batch % step == 0:
        return
    micros = [m for m in divisors_near(global_batch // data_parallel or 1, micro_batch)
              if global_batch % (m * data_parallel) == 0] if global_batch % data_parallel == 0 else []
    fixes = []
    if micros:
        fixes.append(f"trainer.micro_batch_size={_alternatives(micros)}")
    fixes.append(f"trainer.global_batch_size={_alternatives(multiples_near(step, global_batch))}")
    raise ConfigError(
        f"'trainer.global_batch_size' = {global_batch} must be a multiple of "
        f"trainer.micro_batch_size x data-parallel size = {micro_batch} x {data_parallel} = {step} "
        f"(data-parallel size = {how}): set {', or '.join(fixes)}."
    )
