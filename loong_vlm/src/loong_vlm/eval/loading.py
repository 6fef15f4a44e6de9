"""A trained VLM rebuilt on one process from its run: config, dataset, model and weights.

The run's ``config.yaml`` gives the model (with the shapes the data set at training time) and the
dataset; the dataset is prepared and set up again (same tokenizer, placeholder ids and image
geometry as training), the model is built at TP1 / PP1 and the megatron-core distributed checkpoint
is loaded into it, whatever the parallel layout it was saved with.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loong_core.errors import ConfigError

logger = logging.getLogger(__name__)


def resolve_run(path: str | Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint_dir)`` of a run directory (its newest checkpoint) or one of its ``iter_N``.

    Raises:
        ConfigError: The path is missing, has no complete checkpoint or no ``config.yaml`` beside it.
    """
    from loong_core.checkpoint import store

    path = Path(path).expanduser()
    if not path.exists():
        raise ConfigError(f"--checkpoint {path} does not exist; pass a run directory (runs/NAME/STAMP) or one "
                          "of its checkpoints (runs/NAME/STAMP/checkpoints/iter_0000600).")
    if (path / "config.yaml").is_file():
        latest = store.find_latest(path / "checkpoints") if (path / "checkpoints").is_dir() else None
        if latest is None:
            raise ConfigError(f"--checkpoint {path} has no complete checkpoint under checkpoints/; train with "
                              "trainer.save_at_end=true (or a save interval) and try again.")
        return path, latest
    if store.is_complete(path):
        run_dir = path.parent.parent
        if (run_dir / "config.yaml").is_file():
            return run_dir, path
        raise ConfigError(f"--checkpoint {path} is a checkpoint but {run_dir / 'config.yaml'} (the run's config, "
                          "which says how to rebuild the model and its data) is missing; keep the checkpoint "
                          "inside its run directory.")
    raise ConfigError(f"--checkpoint {path}: expected a run directory with config.yaml and checkpoints/, or a "
                      "complete checkpoint inside one (runs/NAME/STAMP/checkpoints/iter_0000600).")


def _run_config(run_dir: Path):
    """The run's validated config, made loadable on one process: no HF initialisation (the weights
    come from the checkpoint) and the encoder at the foundation's (single-rank) parallel layout."""
    import yaml

    from loong_core.config.validate import validate_config
    from loong_core.plugins import get_plugin_system

    raw = yaml.safe_load((run_dir / "config.yaml").read_text())
    model = raw.get("model") or {}
    for section in (model, model.get("foundation") or {}):
        if "init_from_hf" in section:
            section["init_from_hf"] = None
    encoder = model.get("encoder") or {}
    if "tensor_model_parallel_size" in encoder:
        encoder["tensor_model_parallel_size"] = None
        encoder["data_layout"] = "replicate"
    raw["parallel"] = {}
    return validate_config(raw, get_plugin_system().registry())


@dataclass
class LoadedVLM:
    """A VLM ready for forward passes with the data module it trained on.

    Attributes:
        run_dir: The run directory.
        checkpoint: The loaded checkpoint directory.
        config: The run's ``LoongConfig`` (parallel section reset to one process).
        data: The set-up data module (tokenizer, placeholder ids, image geometry).
        provider: The model provider (a ``VLMProvider``).
        model: The composed megatron-core module, eval mode.
    """

    run_dir: Path
    checkpoint: Path
    config: Any
    data: Any
    provider: Any
    model: Any


def load_vlm(checkpoint: str | Path) -> LoadedVLM:
    """Rebuild the run's data module and model on this process and load the checkpoint's weights.

    Raises:
        ConfigError: Not a VLM run, or a path problem (the message names the fix).
        CheckpointError: The checkpoint's tensors do not fit the rebuilt model.
    """
    from loong_core.checkpoint import store
    from loong_core.checkpoint.restricted import mcore_load
    from loong_core.config.schema import ParallelConfig
    from loong_core.engines.megatron import parallel
    from loong_core.engines.megatron.checkpointing import check_tensor_shapes
    from loong_core.plugins import get_plugin_system
    from loong_llm.hf.convert import _init_single_rank
    from loong_vlm.provider import VLMProvider

    run_dir, ckpt = resolve_run(checkpoint)
    store.verify_checkpoint(ckpt)  # every file's size and checksum
    cfg = _run_config(run_dir)
    registry = get_plugin_system().registry()
    provider_cls = registry.get("model", cfg.model.name).load()
    if not (isinstance(provider_cls, type) and issubclass(provider_cls, VLMProvider)):
        raise ConfigError(f"{run_dir} trained model '{cfg.model.name}', which is not a VLM; `loong eval vqa` "
                          "evaluates vlm / qwen2_5_vl / qwen3_vl runs (for a language model use `loong generate` "
                          "or `loong eval perplexity --checkpoint`).")
    if cfg.device.num_threads:  # the run's thread setting, as in training
        import torch

        torch.set_num_threads(cfg.device.num_threads)
    data = registry.get("dataset", cfg.data.name).load()(cfg.data)
    data.prepare()
    data.setup()
    provider = provider_cls(cfg.model)
    provider.apply_data_overrides(data.model_overrides())
    _init_single_rank()
    p = ParallelConfig()
    parallel.initialize(p, seed=cfg.trainer.seed)
    model = provider.build_megatron_model(provider.megatron_config(parallel.transformer_kwargs(p)),
                                          pre_process=True, post_process=True, vp_stage=None)
    foundation = provider.foundation
    if hasattr(foundation, "attach_adapters"):  # a LoRA run's checkpoint holds the foundation's adapters
        foundation.attach_adapters([model.language_model])
    state = {"model": model.sharded_state_dict()}
    check_tensor_shapes(state, str(ckpt))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process")
        warnings.filterwarnings("ignore", category=FutureWarning)  # torch.distributed.checkpoint's own API notice
        loaded = mcore_load(state, ckpt)
    model.load_state_dict(loaded["model"], strict=True)
    model.eval()
    logger.info("loaded %s (%s on %s)", ckpt, cfg.model.name, cfg.data.name)
    return LoadedVLM(run_dir, ckpt, cfg, data, provider, model)
