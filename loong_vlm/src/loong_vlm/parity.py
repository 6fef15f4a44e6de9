"""The VLM families' parity checks (``torchrun ... -m loong_vlm.<family>.testing``).

The rank side: start the ranks on the cpu backend, build a provider's model at a parallel layout
with its HF weights, gather its logits, and write rank 0's results. The test side: :func:`launch`
runs a family's check on N ranks and reads those results."""

from __future__ import annotations

import json
import os
from pathlib import Path


def launch(module: str, out: str | Path, args, nproc: int) -> dict:
    """Run ``torchrun --nproc-per-node NPROC -m MODULE OUT ARGS...`` (one thread per rank); rank 0's
    results.

    Raises:
        AssertionError: The check failed; the message holds the end of its stderr.
    """
    import subprocess
    import sys

    from loong_llm.hf.convert import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
           str(free_port()), "-m", module, str(out), *map(str, args)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-6000:]
    return json.loads(Path(out).read_text())


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
