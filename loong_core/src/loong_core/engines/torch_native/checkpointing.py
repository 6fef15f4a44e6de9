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


_SAVE_GROUP = None


def _save_group():
    """A gloo process group of all ranks for the background save's own collectives (created on
    first use, collectively), so they never interleave with the training loop's on the default
    group."""
    global _SAVE_GROUP
    if _SAVE_GROUP is None and torch.distributed.is_initialized():
        _SAVE_GROUP = torch.distributed.new_group(backend="gloo")
    return _SAVE_GROUP


class DcpAsyncWrite:
    """A ``torch.distributed.checkpoint.async_save`` in flight (an
    :class:`~loong_core.checkpoint.async_save.AsyncWrite`).

    Args:
        future: The future ``async_save`` returned (its thread plans, writes and finishes the save,
            the metadata included).
    """

    def __init__(self, future):
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def finish(self) -> None:
        self.future.result()

    def abort(self) -> None:
        """Wait for the thread (a running write cannot be stopped), so that the partial folder is
        removed after its last file; its error, if any, is the one already being handled."""
        import concurrent.futures

        if not self.future.cancel():
            concurrent.futures.wait([self.future])


def _stager(engine):
    """The engine's staging buffers, kept from one save to the next: the second and later saves
    copy into the host memory of the first instead of allocating (and faulting in) a new copy.
    Reusing them is safe because a save starts only after the previous one was written."""
    stager = getattr(engine, "_checkpoint_stager", None)
    if stager is None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        options = StagingOptions(use_pinned_memory=engine.device.pinned_host_memory, use_shared_memory=False,
                                 use_async_staging=False, use_non_blocking_copy=False)
        stager = DefaultStager(options)
        engine._checkpoint_stager = stager
    return stager


def save_async(engine, directory: str) -> DcpAsyncWrite:
    """Start a collective save of model and optimizer shards into the existing ``directory``;
    returns once the state is copied (staged) to host memory, and a thread writes it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(engine.model, engine.optimizer)
    future = dcp.async_save({"model": model_state, "optimizer": optim_state}, checkpoint_id=directory,
                            process_group=_save_group(), async_stager=_stager(engine))
    return DcpAsyncWrite(future)


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
