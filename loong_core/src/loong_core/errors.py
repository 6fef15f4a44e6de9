"""Error types that loong raises for bad input; each carries a message a user can act on."""

from __future__ import annotations


class LoongError(Exception):
    """Base class of every error loong raises on purpose."""


class ConfigError(LoongError):
    """A configuration value is missing, unknown or of the wrong type."""


class PluginError(LoongError):
    """A plugin failed to load, registered a duplicate name, or is missing."""


class MissingDependencyError(LoongError):
    """An optional dependency is not installed.

    Args:
        package: Import name that failed.
        pip: The pip requirement that provides it.
        purpose: What needed it.
    """

    def __init__(self, package: str, pip: str, purpose: str):
        super().__init__(
            f"{purpose} needs the Python package '{package}', which is not installed. "
            f"Fix: pip install '{pip}'"
        )


class CheckpointError(LoongError):
    """A checkpoint is missing, incomplete or corrupt."""


class CheckpointSaveError(CheckpointError):
    """A checkpoint could not be written for a reason of the storage (a full disk, a quota, an I/O
    error); nothing of it is visible and the checkpoints written before are intact, so training
    can go on (see :meth:`loong_core.trainer.loop.Trainer.save`)."""


class TrainingError(LoongError):
    """Training cannot continue (for example the loss became NaN)."""
