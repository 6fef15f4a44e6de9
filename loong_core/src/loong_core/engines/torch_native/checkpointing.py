"""Model + optimizer through ``torch.distributed.checkpoint`` (DCP), resharding on load.

Keys are the model's own parameter names (wrapper prefixes removed by DCP's ``get_state_dict``),
so a checkpoint written with DDP loads with FSDP2 or HSDP at another world size, and the model's
names stay those of its reference implementation. The schedule and the trainer's common state
(iteration, consumed samples) go to ``loong_state.pt`` written by rank 0.
"""

from __future__ import annotations

from pathlib import Path

import torch

STATE_FILE = "loong_state.pt"


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def save(engine, directory: str) -> None:
    """Collective save of model and optimizer shards into the existing ``directory``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(engine.model, engine.optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=directory)


def save_common(directory: str, scheduler, common_state: dict) -> None:
    """Rank 0 writes the schedule and the trainer's common state."""
    if _rank() == 0:
        torch.save({"scheduler": scheduler.state_dict(), "loong": common_state},
                   Path(directory) / STATE_FILE)


def load(engine, directory: str) -> dict:
    """Collective load of what :func:`save` and :func:`save_common` wrote; returns the common state."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from loong_core.checkpoint.restricted import dcp_load, load_torch_file

    model_state, optim_state = get_state_dict(engine.model, engine.optimizer)
    _drop_states_not_saved(optim_state, directory)
    state = {"model": model_state, "optimizer": optim_state}
    dcp_load(state, directory)
    set_model_state_dict(engine.model, state["model"])
    # Not strict: parameters without a saved state (dropped above) keep a fresh one.
    set_optimizer_state_dict(engine.model, engine.optimizer, state["optimizer"],
                             options=StateDictOptions(strict=False))
    extra = load_torch_file(Path(directory) / STATE_FILE)
    engine.scheduler.load_state_dict(extra["scheduler"])
    return extra["loong"]


def _drop_states_not_saved(optim_state: dict, directory: str) -> None:
    """Forget the optimizer state of parameters the checkpoint has none for.

    ``get_state_dict`` gives every parameter an (empty) Adam state to load into, but a parameter
    that never received a gradient before the save has no state in the checkpoint (frozen or
    unused parts of a model); it keeps a fresh state, as it had when the checkpoint was written.
    """
    from loong_core.checkpoint.restricted import read_metadata_file

    saved = read_metadata_file(Path(directory) / ".metadata").state_dict_metadata
    per_param = optim_state.get("state", {})
    for name in list(per_param):
        if not any(f"optimizer.state.{name}.{key}" in saved for key in per_param[name]):
            del per_param[name]


def load_model_only(model, directory: str) -> None:
    """Load only the model weights (any world size or sharding); works on a plain module too."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from loong_core.checkpoint.restricted import dcp_load

    state = {"model": get_model_state_dict(model)}
    dcp_load(state, directory)
    set_model_state_dict(model, state["model"])


def save_model_only(model, directory: str) -> None:
    """Write a weights-only DCP checkpoint (for example a converted reference model)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=directory)
