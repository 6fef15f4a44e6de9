"""What ``loong sample`` does: load a checkpoint, sample with Euler steps, write PNG / GIF."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from loong_core.errors import ConfigError
from loong_core.step_progress import StepProgress
from loong_diffusion import images
from loong_diffusion.checkpoint_io import load_trained
from loong_diffusion.sampling import euler_sample

logger = logging.getLogger(__name__)


def _class_condition(cfg, classes: str, per_class: int) -> tuple[dict, int]:
    num_classes = getattr(cfg.model, "num_classes", None)
    if num_classes is None:
        raise ConfigError(f"model '{cfg.model.name}' is not class-conditional; use --text-embeds.")
    ids = list(range(num_classes)) if classes == "all" else [int(c) for c in classes.split(",")]
    bad = [c for c in ids if not 0 <= c < num_classes]
    if bad:
        raise ConfigError(f"--class {bad} out of range: the model has classes 0..{num_classes - 1}.")
    labels = torch.tensor(ids).repeat_interleave(per_class)
    return {"class_label": labels}, len(ids)


def _text_condition(path: str) -> tuple[dict, int]:
    data = torch.load(path, weights_only=True)
    embeds = data["text_embeds"]
    mask = data.get("text_mask", torch.ones(embeds.shape[:2], dtype=torch.long))
    return {"text_embeds": embeds, "text_mask": mask}, 1


def _prompt_condition(args) -> tuple[dict, int]:
    """Encode ``--prompt`` with the local text encoder, as `loong data encode-latents` does."""
    from loong_diffusion.data.encode import _load_text_encoder, encode_text

    encoder, tokenizer = _load_text_encoder(args.text_encoder, args.tokenizer, "cpu", torch.float32)
    (embeds,) = encode_text(encoder, tokenizer, [args.prompt], args.max_text_length, "cpu")
    return {"text_embeds": embeds[None], "text_mask": torch.ones(1, embeds.shape[0], dtype=torch.long)}, 1


def latent_shape(cfg, batch: int) -> list[int]:
    """Shape of the latents the model was trained on (from the model or data config)."""
    shape = getattr(cfg.data, "latent_shape", None)
    if shape:
        return [batch, *shape]
    index = Path(getattr(cfg.data, "path", None) or "/nonexistent") / "index.json"
    if index.is_file():  # a latent cache written by `loong data encode-latents`
        records = json.loads(index.read_text())["samples"]
        return [batch, *next(r["latent_shape"] for r in records if "latent_shape" in r)]
    m = cfg.model
    return [batch, m.in_channels, m.image_size, m.image_size]


def generate(args) -> dict:
    """Run ``loong sample`` with parsed ``args``; returns a summary dict."""
    if args.prompt is not None and not getattr(args, "text_encoder", None):
        raise ConfigError("--prompt needs the text encoder the training captions were encoded with: "
                          "pass --text-encoder DIR [--tokenizer DIR] (as given to `loong data "
                          "encode-latents`), or cached embeddings with --text-embeds FILE.")
    cfg, provider, model = load_trained(args.checkpoint, args.device,
                                        getattr(args, "num_threads", None))
    if args.prompt is not None:
        condition, rows = _prompt_condition(args)
    elif args.text_embeds:
        condition, rows = _text_condition(args.text_embeds)
    else:
        condition, rows = _class_condition(cfg, args.classes, args.per_class)
    batch = len(next(iter(condition.values())))
    condition = {k: v.to(args.device) for k, v in condition.items()}
    steps = args.steps or cfg.model.sample_steps
    guidance = cfg.model.guidance_scale if args.guidance is None else args.guidance
    logger.info("sampling %d %s with %d Euler steps on %s (%d threads)", batch,
                "sample" if batch == 1 else "samples", steps, args.device, torch.get_num_threads())
    started = time.perf_counter()
    with StepProgress(steps, "sampling") as progress:
        samples = euler_sample(provider, model, latent_shape(cfg, batch), condition, steps, guidance,
                               torch.Generator().manual_seed(args.seed), args.device, progress.update)
    elapsed = time.perf_counter() - started
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if samples.dim() == 5 or out.suffix.lower() == ".gif":
        images.save_gif(samples if samples.dim() == 5 else samples[:, :, None], out, rows)
    else:
        images.save_png(images.grid(samples, rows), out)
    result = {"out": str(out), "samples": batch, "steps": steps, "guidance": guidance,
              "seconds": round(elapsed, 2)}
    if args.score:
        from loong_diffusion.digits_score import score

        result["score"] = score(samples, condition["class_label"])
    return result
