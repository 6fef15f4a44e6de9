"""``loong data encode-latents``: run a VAE and a text encoder once over a dataset, cache the results.

Light at import time (``loong --help`` stays fast): torch, diffusers and transformers load when it runs.
"""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    """Add the ``encode-latents`` action to the shared ``loong data`` command (core passes its subparsers)."""
    p = subparsers.add_parser(
        "encode-latents",
        help="encode images / frame-folder videos with a VAE and captions with a text encoder into a cache",
        description="Read a folder of images (png/jpg) and videos stored as folders of frames, with "
        "captions from a jsonl ({\"file\": ..., \"caption\": ...}) or sidecar .txt files; encode the "
        "pixels with a diffusers AutoencoderKLWan (--vae) and the captions with a transformers encoder "
        "(--text-encoder, --tokenizer), and write a latent cache (one safetensors file per sample plus "
        "index.json). Train from it with data=latent_cache data.path=OUT_DIR.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p) -> None:
    """The options of ``loong data encode-latents``."""
    p.add_argument("input_dir", metavar="INPUT_DIR", help="folder of images and/or frame folders")
    p.add_argument("out_dir", metavar="OUT_DIR", help="new cache folder (written atomically)")
    p.add_argument("--captions", default=None,
                   help="jsonl with 'file' (relative to INPUT_DIR) and 'caption'; default: sidecar .txt files")
    p.add_argument("--vae", default=None, help="diffusers AutoencoderKLWan folder (config.json + safetensors)")
    p.add_argument("--text-encoder", default=None, help="transformers encoder folder (UMT5/T5EncoderModel)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: --text-encoder)")
    p.add_argument("--resolution", type=int, default=256,
                   help="square side in pixels: shorter side resized, then centre-cropped (default 256)")
    p.add_argument("--num-frames", type=int, default=None,
                   help="frames kept per video (default: all, cut to 4k+1 for the Wan VAE)")
    p.add_argument("--max-text-length", type=int, default=512, help="tokens per caption at most (default 512)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per VAE / encoder call (default 4)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="compute dtype of the encoders (default float32); the cache stores float32")
    p.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")


def run(args, extra) -> int:
    """Encode and write the cache; prints a JSON summary (samples, shapes, samples/s)."""
    from loong_diffusion.data.encode import encode_latents

    summary = encode_latents(
        args.input_dir, args.out_dir, vae=args.vae, text_encoder=args.text_encoder,
        tokenizer=args.tokenizer, captions=args.captions, resolution=args.resolution,
        num_frames=args.num_frames, max_text_length=args.max_text_length, batch_size=args.batch_size,
        device=args.device, dtype=args.dtype, overwrite=args.overwrite)
    print(json.dumps(summary, indent=2))
    return 0
