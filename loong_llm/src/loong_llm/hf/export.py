"""Write a loong model's full (unsharded) state as an HF directory: config.json + safetensors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from loong_core.errors import CheckpointError
from loong_llm.hf.io import Progress, ShardWriter

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@torch.no_grad()
def export_state(adapter, cfg, state: dict, out_dir: str | Path, dtype: str = "bfloat16",
                 hf_config_base: dict | None = None, max_shard_bytes: int = 2 * 2**30) -> int:
    """Write ``state`` (global loong names -> full tensors) as HF safetensors + config.json,
    each tensor to disk as soon as it is made.

    Args:
        adapter: The family's :class:`~loong_llm.hf.adapter.HFAdapter`.
        cfg: The model config.
        state: Full tensors by global loong name (a TP1 / PP1 / EP1 model's state dict, or a
            :class:`~loong_llm.hf.stream_checkpoint.StreamedState` that reads each on access).
        out_dir: Target directory.
        dtype: Storage dtype (``float32``, ``bfloat16``, ``float16``).
        hf_config_base: config.json of the source model, kept where loong has no say.
        max_shard_bytes: Size limit of one safetensors file.

    Returns:
        Bytes written.
    """
    if dtype not in DTYPES:
        raise CheckpointError(f"dtype {dtype!r} is not supported; choices: {', '.join(DTYPES)}.")
    rules = adapter.rule_set(cfg)
    names = [n for n in state if not n.endswith(("_extra_state", "local_tokens_per_expert"))]
    matched = {}
    for name in names:
        try:
            matched[name] = rules.export_names(name)
        except KeyError:
            raise CheckpointError(f"no HF mapping for {name!r} in the '{adapter.family}' "
                                  f"family.") from None
    def hf_tensors(get, stacker):
        """``(HF name, tensor)`` in writing order (``get``: loong name -> full tensor)."""
        for name in names:
            rule, hf_names = matched[name]
            if rule.export:
                for hf_name, tensor in zip(hf_names, rules.to_hf(rule, get(name))):
                    yield from (stacker.add(hf_name, tensor) if stacker else [(hf_name, tensor)])
            yield None, None  # one loong tensor done
        if stacker:
            stacker.close()

    # The layout first (shapes from meta tensors), so that every tensor is written as it is made.
    meta = state.meta if hasattr(state, "meta") else (lambda n: state[n].to("meta"))
    plan = [(h, tuple(t.shape), DTYPES[dtype])
            for h, t in hf_tensors(meta, adapter.export_stacker(cfg)) if h is not None]
    writer = ShardWriter(out_dir, plan, max_shard_bytes)
    progress = Progress(len(names), f"writing {out_dir}")
    for hf_name, tensor in hf_tensors(state.__getitem__, adapter.export_stacker(cfg)):
        if hf_name is None:
            progress.update()
        else:
            writer.add(hf_name, tensor.to(DTYPES[dtype]))
    writer.close()
    progress.close()
    config = adapter.full_hf_config(cfg, hf_config_base, dtype)
    Path(out_dir, "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    logger.info("wrote %s (%.1f MB)", out_dir, writer.bytes_written / 1e6)
    return writer.bytes_written
