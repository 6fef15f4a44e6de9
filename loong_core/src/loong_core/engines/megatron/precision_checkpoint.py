"""Resume a checkpoint at another ``parallel.mixed_precision`` (bf16 -> fp32, fp32 -> bf16, ...).

A bf16 / fp16 checkpoint holds the model's 16-bit weights under the parameter keys and the fp32
main weights of megatron-core's mixed-precision optimizer under ``optimizer.state.fp32_param.<key>``;
an fp32 checkpoint holds fp32 weights under the parameter keys only. Adam's moments use the same
keys in both. Resuming at another precision therefore maps keys:

* mixed -> fp32: the model's fp32 parameters load the fp32 main weights (not the rounded
  16-bit copies), so nothing is lost;
* fp32 -> mixed: the fp32 main weights load the checkpoint's fp32 parameters, and the 16-bit
  model parameters their rounding;
* bf16 <-> fp16: keys agree; the main weights are fp32 on both sides. A fp16 run started from a
  bf16 or fp32 checkpoint begins with a fresh loss scaler.

Then the optimizer's non-tensor state (param groups, Adam's step), which megatron-core nests
differently for the two optimizer classes, is regrouped. The distributed optimizer keeps its
fp32 copy in every precision, but its layout is not regrouped here: changing precision with
``use_distributed_optimizer`` is refused with a clear error.
"""

from __future__ import annotations

import torch

MAIN_PREFIX = "optimizer.state.fp32_param."
MODEL_REF = "loong:model-tensor"


def _sharded_tensors(state):
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return [value for value in nested_values(state) if isinstance(value, ShardedTensor)]


def saved_params_dtype(model_state: dict, metadata: dict):
    """Dtype of the model weights in the checkpoint (None when no key matches)."""
    for tensor in _sharded_tensors(model_state):
        if tensor.key in metadata and metadata[tensor.key].dtype.is_floating_point:
            return metadata[tensor.key].dtype
    return None


def adapt_request(engine, state: dict, metadata: dict, directory: str) -> bool:
    """Point the load request of ``state`` at the keys a checkpoint of another precision uses.

    Returns:
        Whether the checkpoint's precision differs from the run's (then :func:`adapt_loaded`
        must regroup the loaded optimizer state).

    Raises:
        CheckpointError: The precision differs and the run uses the distributed optimizer.
    """
    from loong_core.errors import CheckpointError

    model_state = {key: value for key, value in state.items() if key != "optimizer"}
    saved = saved_params_dtype(model_state, metadata)
    current = engine.precision.params_dtype
    if saved is None or saved == current:
        return False
    saved_mixed, current_mixed = saved != torch.float32, engine.precision.mixed
    if saved_mixed == current_mixed:
        return False  # bf16 <-> fp16: same keys, fp32 main weights on both sides
    if engine.config.parallel.use_distributed_optimizer:
        raise CheckpointError(
            f"{directory} was saved with {str(saved).replace('torch.', '')} parameters and this run "
            f"trains in {engine.precision.name} with the distributed optimizer, whose state cannot "
            f"change precision on load. Resume with parallel.mixed_precision matching the "
            f"checkpoint, or once with parallel.use_distributed_optimizer=false.")
    if saved_mixed:  # mixed -> fp32: the fp32 parameters take the fp32 main weights
        for tensor in _sharded_tensors(model_state):
            if MAIN_PREFIX + tensor.key in metadata:
                tensor.key = MAIN_PREFIX + tensor.key
    else:  # fp32 -> mixed: the fp32 main weights take the checkpoint's fp32 parameters
        _main_weights_from_model(engine, state, model_state, saved)
    return True


def _main_weights_from_model(engine, state: dict, model_state: dict, saved) -> None:
    """Read the model's tensors as saved (fp32; cast when copied into the 16-bit parameters) and
    leave the fp32 main weights out of the request: :func:`adapt_loaded` takes them from the
    loaded model tensors (a checkpoint key can be read only once per load)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    from loong_core.errors import CheckpointError

    if not hasattr(_single(engine.optimizer), "float16_groups"):
        raise CheckpointError(
            f"resuming an fp32 checkpoint in {engine.precision.name} is supported for models with one "
            "optimizer (no experts, no virtual pipeline); resume it at fp32 (parallel.mixed_precision=fp32).")
    for entries in model_state.values():
        for tensor in entries.values():
            if isinstance(tensor, (ShardedTensor, ShardedTensorFactory)):
                tensor.data = torch.empty_like(tensor.data, dtype=saved)
                if isinstance(tensor, ShardedTensor):
                    tensor.dtype = saved
    groups = state["optimizer"]["fp32_from_fp16_params"]
    state["optimizer"]["fp32_from_fp16_params"] = [[MODEL_REF] * len(group) for group in groups]


def _single(optimizer):
    """The one optimizer inside megatron-core's ``ChainedOptimizer`` (else itself)."""
    chained = getattr(optimizer, "chained_optimizers", None)
    return chained[0] if chained is not None and len(chained) == 1 else optimizer


def _model_names(engine) -> dict:
    """``id(parameter) -> (checkpoint chunk key, state-dict name)``."""
    names = {}
    for i, chunk in enumerate(engine.model):
        key = "model" if len(engine.model) == 1 else f"model{i}"
        for name, param in chunk.module.state_dict(keep_vars=True).items():
            names[id(param)] = (key, name)
    return names


def _merged_state(*states) -> dict:
    merged: dict = {}
    for state in states:
        merged.update(state or {})
    return merged


def adapt_loaded(engine, loaded: dict) -> dict:
    """The loaded optimizer state of another precision, regrouped for this run's optimizer.

    megatron-core's mixed-precision optimizer nests ``{"optimizer": {state, param_groups},
    "fp32_from_fp16_params": ...}``; its fp32 optimizer has ``{state, param_groups}`` at the top.
    The checkpoint's non-tensor part arrives in the saved nesting, the tensors in the requested
    one; both are put where this run's optimizer expects them.

    Args:
        engine: The megatron engine.
        loaded: Everything :func:`dist_checkpointing.load` returned for the adapted request.
    """
    optimizer_state = loaded["optimizer"]
    inner = optimizer_state.get("optimizer", {})
    state = _merged_state(optimizer_state.get("state"), inner.get("state"))
    # Saved group settings in one nesting, the requested groups' parameter ids in the other.
    groups = [_merged_state(*pair) for pair in zip(optimizer_state.get("param_groups", []),
                                                    inner.get("param_groups", []))]
    if not engine.precision.mixed:
        return {"state": state, "param_groups": groups}
    main = optimizer_state.get("fp32_from_fp16_params")
    if main is None or any(isinstance(item, str) for group in main for item in group):
        names = _model_names(engine)
        main = [[loaded[names[id(param)][0]][names[id(param)][1]].float() for param in group]
                for group in _single(engine.optimizer).float16_groups]
    return {"optimizer": {"state": state, "param_groups": groups}, "fp32_from_fp16_params": main}
