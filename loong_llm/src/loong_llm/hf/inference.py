"""One-process inference for sanity checks: greedy generation and perplexity, from an HF
directory or a loong checkpoint, on our megatron-core model (TP1 / PP1)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

from loong_core.errors import ConfigError
from loong_core.step_progress import StepProgress

logger = logging.getLogger(__name__)


class LoadedModel:
    """A model ready for forward passes plus its tokenizer.

    Attributes:
        model: The megatron-core GPTModel (eval mode).
        config: Its loong model config.
        tokenizer: A ``tokenizers.Tokenizer``.
    """

    def __init__(self, model, config, tokenizer):
        self.model, self.config, self.tokenizer = model, config, tokenizer

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[b, s, vocab]`` logits (padding columns removed) for ``[b, s]`` token ids."""
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        out = self.model(tokens, positions, None)
        return out[..., : self.config.vocab_size].float()


def _tokenizer(directory: Path | None, explicit: str | None):
    from tokenizers import Tokenizer

    path = Path(explicit) if explicit else directory
    if path is not None and path.is_dir():
        path = path / "tokenizer.json"
    if path is None or not path.is_file():
        raise ConfigError(f"no tokenizer.json found ({path}): the checkpoint has no HF files and "
                          "its run no data/tokenizer/ folder; pass --tokenizer FILE_OR_DIR.")
    return Tokenizer.from_file(str(path))


def load(hf: str | None = None, checkpoint: str | None = None, family: str | None = None,
         tokenizer: str | None = None) -> LoadedModel:
    """Build the model from ``hf`` (with ``family``, or the one matching its ``model_type``) or
    from a loong ``checkpoint``."""
    from loong_core.config.schema import ParallelConfig
    from loong_core.engines.megatron import parallel
    from loong_llm.hf import convert
    from loong_llm.hf.adapter import read_hf_config
    from loong_llm.hf.registry import family_for_model_type

    if (hf is None) == (checkpoint is None):
        raise ConfigError("give exactly one of --hf DIR or --checkpoint DIR.")
    if hf is not None:
        if family is None:
            family = family_for_model_type(read_hf_config(hf).get("model_type"),
                                           str(Path(hf) / "config.json"))
        entry, _ = convert._model_entry(family)
        cfg = entry.load_meta("config")(name=family, init_from_hf=str(hf))
        files = Path(hf)
    else:
        from loong_core.checkpoint import store
        from loong_core.config.validate import build_dataclass
        from loong_llm.hf.export_files import run_tokenizer_dir

        checkpoint = store.resolve_checkpoint(checkpoint)  # a run directory: its newest one
        model_dict, _, _, files = convert._model_config_of(checkpoint)
        if files is None or not (files / "tokenizer.json").is_file():
            files = run_tokenizer_dir(checkpoint) or files  # the tokenizer the run trained with
        entry, _ = convert._model_entry(model_dict["name"])
        cfg = build_dataclass(entry.load_meta("config"), {**model_dict, "init_from_hf": None}, "model")
    convert._init_single_rank()
    provider = entry.load()(cfg)
    p = ParallelConfig()
    parallel.initialize(p, seed=0)
    model = provider.build_megatron_model(provider.megatron_config(parallel.transformer_kwargs(p)),
                                          pre_process=True, post_process=True, vp_stage=None)
    if hf is not None:
        provider.initialize_weights([model])
    else:
        from loong_core.checkpoint.restricted import mcore_load

        provider.attach_adapters([model])  # a LoRA run's checkpoint holds its adapters
        loaded = mcore_load({"model": model.sharded_state_dict()}, checkpoint)
        model.load_state_dict(loaded["model"], strict=True)
    model.eval()
    return LoadedModel(model, cfg, _tokenizer(files, tokenizer))


def generate(lm: LoadedModel, prompt: str, max_new_tokens: int = 32) -> str:
    """Greedy continuation of ``prompt`` (recomputes the whole prefix each step; for sanity checks)."""
    ids = lm.tokenizer.encode(prompt).ids
    if not ids:
        raise ConfigError("the prompt encodes to no tokens.")
    limit = lm.config.max_position_embeddings
    new = []
    for _ in range(max_new_tokens):
        window = torch.tensor([(ids + new)[-limit:]])
        new.append(int(lm.logits(window)[0, -1].argmax()))
    return lm.tokenizer.decode(new)


def perplexity(lm: LoadedModel, text: str, seq_length: int = 512) -> dict:
    """Perplexity of ``text`` in non-overlapping windows of ``seq_length`` tokens."""
    ids = lm.tokenizer.encode(text).ids
    seq_length = min(seq_length, lm.config.max_position_embeddings)
    nll, count = 0.0, 0
    starts = range(0, max(len(ids) - 1, 0), seq_length)
    with StepProgress(len(starts), f"perplexity over {len(ids)} tokens") as progress:
        for done, start in enumerate(starts, 1):
            chunk = torch.tensor([ids[start: start + seq_length + 1]])
            if chunk.shape[1] < 2:
                break
            logits = lm.logits(chunk[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum")
            nll += float(loss)
            count += chunk.shape[1] - 1
            progress.update(done)
    if count == 0:
        raise ConfigError("the text has fewer than 2 tokens.")
    return {"perplexity": math.exp(nll / count), "tokens": count, "nll": nll / count}
