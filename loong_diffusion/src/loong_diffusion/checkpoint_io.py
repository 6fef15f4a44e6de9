"""Rebuild a trained diffusion model from a loong checkpoint directory (no process group needed)."""

from __future__ import annotations

import warnings
from pathlib import Path

import yaml

from loong_core.errors import CheckpointError


def run_config_of(checkpoint: Path) -> dict:
    """The run's composed config (``<run_dir>/config.yaml`` two levels above the checkpoint)."""
    path = Path(checkpoint).resolve().parents[1] / "config.yaml"
    if not path.is_file():
        raise CheckpointError(f"{checkpoint}: no run config at {path}; pass a checkpoint directory "
                              f"of a loong run (runs/<name>/<time>/checkpoints/iter_NNNNNNN).")
    return yaml.safe_load(path.read_text())


def load_trained(checkpoint: str | Path, device: str = "cpu", num_threads: int | None = None):
    """Return ``(config, provider, model)`` with the checkpoint's weights, in eval mode.

    Args:
        checkpoint: A checkpoint ``iter_N`` or a run directory (its newest checkpoint).
        device: Torch device to load onto.
        num_threads: CPU threads; None takes the run's ``device.num_threads`` as training did.

    Raises:
        CheckpointError: Not a checkpoint of a diffusion model (naming what it holds).
    """
    import torch

    from loong_core.checkpoint import store
    from loong_core.config.validate import validate_config
    from loong_core.engines.torch_native.checkpointing import load_model_only
    from loong_core.plugins import get_plugin_system
    from loong_diffusion.provider import DiffusionProvider

    checkpoint = store.resolve_checkpoint(checkpoint)
    store.verify_checkpoint(checkpoint)  # every file's size and checksum
    registry = get_plugin_system().registry()
    cfg = validate_config(run_config_of(checkpoint), registry)
    provider_class = registry.get("model", cfg.model.name).load()
    if not issubclass(provider_class, DiffusionProvider):
        raise CheckpointError(
            f"{checkpoint} holds a '{cfg.model.name}' model (experiment {cfg.name}), not a "
            "diffusion model, so `loong sample` cannot draw from it: use `loong generate` for "
            "LLMs, `loong eval vqa` for VLMs, `loong eval rollout` for robot policies.")
    threads = num_threads or cfg.device.num_threads
    if threads:
        torch.set_num_threads(threads)
    provider = provider_class(cfg.model)
    model = provider.build_torch_model()
    with warnings.catch_warnings():  # DCP notes that it loads in a single process: intended
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        load_model_only(model, str(checkpoint))
    return cfg, provider, model.to(device).eval()
