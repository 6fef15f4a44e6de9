"""Encode a folder of images / frame-folder videos (+ captions) into a latent cache, once.

Cache layout (``OUT_DIR``)::

    index.json                 format, encoders, normalisation stats, one record per sample
    latents/000000.safetensors "latents" [C, F, H, W] float32, normalised like the Wan pipelines
    text/000000.safetensors    "text_embeds" [n, D] float32 (the caption's n real tokens, no padding)

Latents are the VAE posterior *mean* (deterministic), normalised as ``(z - latents_mean) / latents_std``
with the stats of the VAE's config (recorded in the index). The folder is built under a temporary
name next to ``OUT_DIR`` and renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Optional

import torch

from loong_core.data.manifest import write_manifest
from loong_core.errors import ConfigError

IMAGE_EXTS = (".png", ".jpg", ".jpeg")
FORMAT = "loong-latent-cache/1"


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTS


def discover(input_dir: Path) -> list[tuple[str, Path]]:
    """``("image", file)`` for each image and ``("video", folder)`` for each folder of frames, sorted."""
    items = []
    for path in sorted(input_dir.iterdir()):
        if _is_image(path):
            items.append(("image", path))
        elif path.is_dir() and any(_is_image(p) for p in path.iterdir()):
            items.append(("video", path))
    if not items:
        raise ConfigError(f"No images (png/jpg) or frame folders found in {input_dir}.")
    return items


def load_captions(input_dir: Path, items, captions: Optional[str]) -> list[Optional[str]]:
    """One caption per item: from the jsonl (by relative path or name), else a sidecar ``.txt``."""
    table: dict[str, str] = {}
    if captions:
        with open(captions, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    table[str(row["file"]).rstrip("/")] = row["caption"]
    out = []
    for _, path in items:
        rel = path.relative_to(input_dir).as_posix()
        caption = table.get(rel, table.get(path.name, table.get(path.stem)))
        if caption is None:
            for sidecar in (path.with_suffix(".txt") if path.is_file() else path.parent / f"{path.name}.txt",
                            path / "caption.txt"):
                if sidecar.is_file():
                    caption = sidecar.read_text(encoding="utf-8").strip()
                    break
        out.append(caption)
    return out


def load_image(path: Path, resolution: int) -> torch.Tensor:
    """``[3, H, W]`` in [-1, 1]: shorter side resized to ``resolution``, then centre-cropped square."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        scale = resolution / min(w, h)
        nw, nh = max(resolution, round(w * scale)), max(resolution, round(h * scale))
        if (nw, nh) != (w, h):
            im = im.resize((nw, nh), Image.BICUBIC)
        left, top = (nw - resolution) // 2, (nh - resolution) // 2
        im = im.crop((left, top, left + resolution, top + resolution))
        arr = np.asarray(im, dtype=np.float32)
    return torch.from_numpy(arr).permute(2, 0, 1) / 127.5 - 1.0


def load_pixels(kind: str, path: Path, resolution: int, num_frames: Optional[int]) -> torch.Tensor:
    """``[3, F, H, W]`` in [-1, 1]; a video keeps ``num_frames`` (default: the most of the form 4k+1)."""
    if kind == "image":
        return load_image(path, resolution).unsqueeze(1)
    frames = sorted(p for p in path.iterdir() if _is_image(p))
    keep = num_frames or (len(frames) - 1) // 4 * 4 + 1
    if keep > len(frames):
        raise ConfigError(f"{path} has {len(frames)} frames; --num-frames {keep} asks for more.")
    return torch.stack([load_image(p, resolution) for p in frames[:keep]], dim=1)


def _load_vae(path: str, device, dtype):
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(path, torch_dtype=dtype, local_files_only=True).to(device).eval()
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(1, z, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, dtype=torch.float32).view(1, z, 1, 1, 1)
    return vae, mean, std


def _load_text_encoder(path: str, tokenizer: Optional[str], device, dtype):
    import transformers

    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    cls = {"umt5": transformers.UMT5EncoderModel, "t5": transformers.T5EncoderModel}.get(
        config.model_type, transformers.AutoModel)
    model = cls.from_pretrained(path, torch_dtype=dtype, local_files_only=True)
    if cls is transformers.AutoModel and hasattr(model, "get_encoder"):
        model = model.get_encoder()
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer or path, local_files_only=True)
    return model.to(device).eval(), tok


@torch.no_grad()
def encode_vae(vae, mean, std, pixels: torch.Tensor, device, dtype) -> torch.Tensor:
    """Normalised posterior means ``[B, C, F', H', W']`` (float32, on the CPU) of ``[B, 3, F, H, W]``."""
    z = vae.encode(pixels.to(device=device, dtype=dtype)).latent_dist.mode().float().cpu()
    return (z - mean) / std


@torch.no_grad()
def encode_text(model, tok, captions: list[str], max_length: int, device) -> list[torch.Tensor]:
    """One ``[n_i, D]`` float32 tensor per caption (its real tokens only)."""
    batch = tok(captions, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    mask = batch["attention_mask"]
    hidden = model(input_ids=batch["input_ids"].to(device), attention_mask=mask.to(device)).last_hidden_state
    hidden = hidden.float().cpu()
    return [hidden[i, : int(mask[i].sum())].contiguous() for i in range(len(captions))]


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with diffusers / transformers
        return None
    return tqdm(total=total, desc=desc, unit="sample", dynamic_ncols=True)


def encode_latents(input_dir, out_dir, *, vae: Optional[str] = None, text_encoder: Optional[str] = None,
                   tokenizer: Optional[str] = None, captions: Optional[str] = None, resolution: int = 256,
                   num_frames: Optional[int] = None, max_text_length: int = 512, batch_size: int = 4,
                   device: str = "cpu", dtype: str = "float32", overwrite: bool = False) -> dict:
    """Write the cache (see the module docstring) and return a summary (samples, shapes, samples/s)."""
    from safetensors.torch import save_file

    if not vae and not text_encoder:
        raise ConfigError("Nothing to encode: pass --vae and/or --text-encoder.")
    if resolution <= 0 or batch_size <= 0:
        raise ConfigError("--resolution and --batch-size must be positive.")
    input_dir, out_dir = Path(input_dir).expanduser(), Path(out_dir).expanduser()
    if out_dir.exists() and not overwrite:
        raise ConfigError(f"{out_dir} exists; pass --overwrite to replace it.")
    items = discover(input_dir)
    texts = load_captions(input_dir, items, captions)
    if text_encoder and any(t is None for t in texts):
        missing = [str(p) for (_, p), t in zip(items, texts) if t is None][:5]
        raise ConfigError(f"No caption for {missing} (use --captions FILE.jsonl or sidecar .txt files).")
    torch_dtype = getattr(torch, dtype)
    started = time.perf_counter()
    vae_model = encoder = text_dim = None
    if vae:
        vae_model, mean, std = _load_vae(vae, device, torch_dtype)
    if text_encoder:
        encoder, tok = _load_text_encoder(text_encoder, tokenizer, device, torch_dtype)
    loaded = time.perf_counter()

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "latents").mkdir(parents=True)
    (tmp / "text").mkdir()
    records: list[dict] = [{"file": p.relative_to(input_dir).as_posix(), "kind": k, "caption": t}
                           for (k, p), t in zip(items, texts)]
    bar = _progress(len(items), "encode-latents")
    try:
        for start in range(0, len(items), batch_size):
            idx = list(range(start, min(start + batch_size, len(items))))
            stem = [f"{i:06d}" for i in idx]
            if vae_model is not None:
                pixels = [load_pixels(*items[i], resolution, num_frames) for i in idx]
                groups: dict[tuple, list[int]] = {}  # one VAE call per pixel shape in the batch
                for j, px in enumerate(pixels):
                    groups.setdefault(tuple(px.shape), []).append(j)
                for js in groups.values():
                    lat = encode_vae(vae_model, mean, std, torch.stack([pixels[j] for j in js]), device,
                                     torch_dtype)
                    for j, z in zip(js, lat):
                        i = idx[j]
                        rel = f"latents/{stem[j]}.safetensors"
                        save_file({"latents": z.contiguous()}, str(tmp / rel))
                        records[i].update(latents=rel, latent_shape=list(z.shape),
                                          pixel_shape=list(pixels[j].shape))
            if encoder is not None:
                embeds = encode_text(encoder, tok, [texts[i] for i in idx], max_text_length, device)
                text_dim = int(embeds[0].shape[-1])
                for j, (i, e) in enumerate(zip(idx, embeds)):
                    rel = f"text/{stem[j]}.safetensors"
                    save_file({"text_embeds": e}, str(tmp / rel))
                    records[i].update(text=rel, text_tokens=int(e.shape[0]))
            if bar is not None:
                bar.update(len(idx))
        if bar is not None:
            bar.close()
        seconds = time.perf_counter() - loaded
        index = {
            "format": FORMAT,
            "num_samples": len(records),
            "resolution": resolution,
            "num_frames": num_frames,
            "vae": None if vae_model is None else {
                "path": str(Path(vae).resolve()), "class": type(vae_model).__name__, "z_dim": vae_model.config.z_dim,
                "normalisation": "(mean_of_posterior - latents_mean) / latents_std",
                "latents_mean": [float(x) for x in vae_model.config.latents_mean],
                "latents_std": [float(x) for x in vae_model.config.latents_std],
                "scaling_factor": getattr(vae_model.config, "scaling_factor", None), "dtype": dtype},
            "text_encoder": None if encoder is None else {
                "path": str(Path(text_encoder).resolve()), "class": type(encoder).__name__,
                "tokenizer": str(Path(tokenizer or text_encoder).resolve()), "max_length": max_text_length,
                "dim": text_dim, "max_tokens": max((r.get("text_tokens", 0) for r in records), default=0),
                "dtype": dtype},
            "samples": records,
        }
        (tmp / "index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
        write_manifest(tmp)  # sizes and CRC-32 of every file, checked when the cache is used
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        if bar is not None:
            bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    latent_shapes = sorted({tuple(r["latent_shape"]) for r in records if "latent_shape" in r})
    return {"path": str(out_dir), "samples": len(records), "latent_shapes": [list(s) for s in latent_shapes],
            "text_dim": index["text_encoder"] and index["text_encoder"]["dim"],
            "load_seconds": round(loaded - started, 3), "encode_seconds": round(seconds, 3),
            "samples_per_second": round(len(records) / max(seconds, 1e-9), 2)}
