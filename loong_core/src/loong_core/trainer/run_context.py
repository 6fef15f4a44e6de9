"""What lifecycle hooks receive about the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunContext:
    """The run as plugins see it.

    Attributes:
        config: The validated :class:`~loong_core.config.schema.LoongConfig`.
        run_dir: Directory of this run.
        rank: Global rank.
        world_size: All ranks.
        iteration: Steps completed so far.
        layout: The engine's :class:`~loong_core.engines.base.ParallelLayout`.
        extras: Free space for plugins.
    """

    config: Any
    run_dir: Path
    rank: int
    world_size: int
    iteration: int = 0
    layout: Any = None
    extras: dict = field(default_factory=dict)
