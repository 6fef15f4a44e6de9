"""The rank side of the VLM families' parity checks (``torchrun ... -m loong_vlm.<family>.testing``):
start the ranks on the cpu backend, build a provider's model at a parallel layout with its HF
weights, gather its logits, and write rank 0's results."""

from __future__ import annotations

import json
import os
from pathlib import Path


def start_ranks() -> None:
    """This process as one rank on gloo with the cpu backend's megatron-core redirects (call it
    after the transformers references are computed: the redirects break their rotary buffers)."""
    import torch

    from loong_core.devices.cpu import CPUBackend

    CPUBackend(int(os.environ.get("LOCAL_RANK", 0)), num_threads=1).setup()
    torch.distributed.init_process_group("gloo")


def build_loaded_model(provider, parallel_config):
    """``provider``'s model at ``parallel_config``, its ``model.init_from_hf`` weights loaded, in
    eval mode (call :func:`finish_layout` after using it)."""
    from loong_core.engines.megatron import parallel

    parallel.initialize(parallel_config, seed=1234)
    model = provider.build_megatron_model(provider.megatron_config(parallel.transformer_kwargs(parallel_config)),
                                          True, True, None)
    provider.initialize_weights([model])
    return model.eval()


def full_logits(logits, vocab: int):
    """Logits gathered over the TP group, cut to the true vocabulary."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    return gather_from_tensor_model_parallel_region(logits)[..., :vocab]


def finish_layout() -> None:
    """Tear down the layout :func:`build_loaded_model` set up."""
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()


def write_results(out: str | Path, results: dict) -> None:
    """Rank 0 writes ``results`` as JSON; every rank leaves the process group."""
    import torch

    if torch.distributed.get_rank() == 0:
        Path(out).write_text(json.dumps(results))
    torch.distributed.destroy_process_group()
