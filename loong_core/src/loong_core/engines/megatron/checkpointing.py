"""Model + optimizer + scheduler through megatron-core dist_checkpointing (reshardable)."""

from __future__ import annotations

import torch

SHARDING_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


def _model_sharded_state(engine) -> dict:
    chunks = engine.model
    if len(chunks) == 1:
        return {"model": chunks[0].module.sharded_state_dict()}
    return {f"model{i}": chunk.module.sharded_state_dict() for i, chunk in enumerate(chunks)}


def _load_model_state(engine, loaded: dict) -> None:
    if len(engine.model) == 1:
        engine.model[0].module.load_state_dict(loaded["model"], strict=True)
        return
    for i, chunk in enumerate(engine.model):
        chunk.module.load_state_dict(loaded[f"model{i}"], strict=True)


def _sharded_state(engine, is_loading: bool) -> dict:
    state = _model_sharded_state(engine)
    # The optimizer maps its params through the (nested) model state of every chunk.
    state["optimizer"] = engine.optimizer.sharded_state_dict(
        dict(state), is_loading=is_loading, metadata=SHARDING_METADATA)
    return state


def save(engine, directory: str, common_state: dict) -> None:
    """Collective save into an existing empty ``directory``."""
    from megatron.core import dist_checkpointing

    state = _sharded_state(engine, is_loading=False)
    state["scheduler"] = engine.scheduler.state_dict()
    state["loong"] = common_state
    dist_checkpointing.save(state, directory)


def _restore_zero_step(state) -> None:
    """megatron-core saves Adam's shared ``step`` only when it is non-zero, so the optimizer state
    of a checkpoint taken before the first step (``loong convert hf-to-loong`` writes one) comes
    back without it, which torch's Adam rejects; give such per-parameter states ``step = 0``."""
    if isinstance(state, (list, tuple)):
        for item in state:
            _restore_zero_step(item)
    elif isinstance(state, dict):
        per_param = state.get("state")
        if isinstance(per_param, dict) and "common_step" not in per_param:
            for value in per_param.values():
                if isinstance(value, dict) and "exp_avg" in value and "step" not in value:
                    value["step"] = torch.tensor(0.0)
        for value in state.values():
            if isinstance(value, (dict, list, tuple)) and value is not per_param:
                _restore_zero_step(value)


def load(engine, directory: str) -> dict:
    """Collective load; returns the ``common_state`` given to :func:`save`."""
    from megatron.core import dist_checkpointing

    state = _sharded_state(engine, is_loading=True)
    state["scheduler"] = None
    state["loong"] = None
    loaded = dist_checkpointing.load(state, directory)
    _load_model_state(engine, loaded)
    _restore_zero_step(loaded["optimizer"])
    with torch.no_grad():
        engine.optimizer.load_state_dict(loaded["optimizer"])
    engine.scheduler.load_state_dict(loaded["scheduler"])
    return loaded["loong"]


def load_model_only(engine, directory: str) -> None:
    """Load only the model weights (any parallel layout); optimizer and scheduler stay fresh."""
    from megatron.core import dist_checkpointing

    state = _model_sharded_state(engine)
    loaded = dist_checkpointing.load(state, directory)
    _load_model_state(engine, loaded)
    # The optimizer holds its own fp32 copies when it shards state; refresh them from the model.
    reload = getattr(engine.optimizer, "reload_model_params", None)
    if reload is not None:
        reload()
