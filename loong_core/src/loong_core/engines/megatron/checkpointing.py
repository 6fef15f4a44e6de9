"""Model + optimizer + scheduler through megatron-core dist_checkpointing (reshardable)."""

from __future__ import annotations

import torch

from loong_core.engines import optimizer_implementation
from loong_core.engines.megatron import precision_checkpoint

SHARDING_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


def _model_sharded_state(engine) -> dict:
    chunks = engine.model
    if len(chunks) == 1:
        return {"model": chunks[0].module.sharded_state_dict()}
    return {f"model{i}": chunk.module.sharded_state_dict() for i, chunk in enumerate(chunks)}


def check_tensor_shapes(model_state: dict, directory: str) -> None:
    """Refuse a checkpoint whose tensors have other global shapes than the model's.

    dist_checkpointing reads the overlapping part of a bigger tensor without complaint (a
    512-token embedding loads into a 384-token model), so shapes are compared before loading.

    Raises:
        CheckpointError: Names every mismatching tensor with both shapes.
    """
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from loong_core.checkpoint.restricted import mcore_tensors_metadata
    from loong_core.errors import CheckpointError

    saved = mcore_tensors_metadata(directory)
    wrong = []
    for tensor in nested_values(model_state):
        if isinstance(tensor, ShardedTensor) and tensor.key in saved:
            want, have = tuple(tensor.global_shape), tuple(saved[tensor.key].global_shape)
            if want != have:
                wrong.append(f"{tensor.key}: checkpoint {list(have)}, model {list(want)}")
    if wrong:
        listed = "; ".join(wrong[:5]) + (f"; and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        raise CheckpointError(
            f"{directory} does not fit the model: {listed}. The model config differs from the one the "
            "checkpoint was written with (vocabulary size, hidden sizes, layers, experts); compare "
            "with the config.yaml of the run that wrote it.")


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


def _full_state(engine, common_state: dict) -> dict:
    state = _sharded_state(engine, is_loading=False)
    state["scheduler"] = engine.scheduler.state_dict()
    state["loong"] = common_state
    return state


def save(engine, directory: str, common_state: dict) -> None:
    """Collective save into an existing empty ``directory``."""
    from megatron.core import dist_checkpointing

    from loong_core.engines.megatron.async_checkpoint import install_results_queue

    install_results_queue(asynchronous=False)
    dist_checkpointing.save(_full_state(engine, common_state), directory)


def save_async(engine, directory: str, common_state: dict):
    """Start a collective save into an existing empty ``directory``; returns once a forked writer
    holds the state (:mod:`~loong_core.engines.megatron.async_checkpoint`)."""
    from megatron.core import dist_checkpointing

    from loong_core.engines.megatron.async_checkpoint import McoreAsyncWrite, install_results_queue

    install_results_queue(asynchronous=True)
    request = dist_checkpointing.save(_full_state(engine, common_state), directory, async_sharded_save=True)
    return McoreAsyncWrite(request)


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
    from loong_core.checkpoint.restricted import mcore_load, mcore_tensors_metadata

    state = _sharded_state(engine, is_loading=True)
    check_tensor_shapes({key: value for key, value in state.items() if key != "optimizer"}, directory)
    other_precision = precision_checkpoint.adapt_request(engine, state, mcore_tensors_metadata(directory),
                                                         directory)
    state["scheduler"] = None
    state["loong"] = None
    loaded = mcore_load(state, directory)
    _load_model_state(engine, loaded)
    if other_precision:
        loaded["optimizer"] = precision_checkpoint.adapt_loaded(engine, loaded)
    _restore_zero_step(loaded["optimizer"])
    with torch.no_grad():
        engine.optimizer.load_state_dict(loaded["optimizer"])
    optimizer_implementation.place_step_counts(optimizer_implementation.torch_optimizers(engine.optimizer))
    engine.scheduler.load_state_dict(loaded["scheduler"])
    return loaded["loong"]


def load_model_only(engine, directory: str) -> None:
    """Load only the model weights (any parallel layout); optimizer and scheduler stay fresh."""
    from loong_core.checkpoint.restricted import mcore_load

    state = _model_sharded_state(engine)
    check_tensor_shapes(state, directory)
    loaded = mcore_load(state, directory)
    _load_model_state(engine, loaded)
    # The optimizer holds its own fp32 copies when it shards state; refresh them from the model.
    reload = getattr(engine.optimizer, "reload_model_params", None)
    if reload is not None:
        reload()
