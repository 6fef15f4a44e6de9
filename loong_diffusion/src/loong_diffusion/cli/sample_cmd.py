"""``loong sample --checkpoint DIR [--class ...] --steps N --out FILE``: light, no torch at import."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    """Add the ``sample`` subcommand."""
    p = subparsers.add_parser(
        "sample",
        help="generate images (PNG grid) or latent videos (GIF) from a diffusion checkpoint",
        description="Load a checkpoint of a loong diffusion run and integrate the flow-matching "
                    "ODE with Euler steps from noise. Class-conditional models take --class; "
                    "text-conditioned models take --prompt with --text-encoder DIR, or "
                    "--text-embeds (a tensor file of cached prompt embeddings).",
    )
    p.add_argument("--checkpoint", required=True,
                   help="a run directory (its newest checkpoint) or runs/<name>/<time>/checkpoints/iter_N")
    p.add_argument("--class", dest="classes", default="all",
                   help="comma-separated class ids, or 'all' (class-conditional models)")
    p.add_argument("--text-embeds", default=None,
                   help="torch file with 'text_embeds' [N, L, D] and 'text_mask' [N, L] (text models)")
    p.add_argument("--prompt", default=None,
                   help="a text prompt, encoded with --text-encoder (text-conditioned models)")
    p.add_argument("--text-encoder", default=None,
                   help="local text-encoder folder (the one given to `loong data encode-latents`)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the text encoder's)")
    p.add_argument("--max-text-length", type=int, default=512, help="prompt tokens at most")
    p.add_argument("--per-class", type=int, default=8, help="samples per class (one grid row each)")
    p.add_argument("--steps", type=int, default=None, help="Euler steps (default: model.sample_steps)")
    p.add_argument("--guidance", type=float, default=None, help="CFG scale (default: model.guidance_scale)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial noise")
    p.add_argument("--out", required=True, help="output .png (images) or .gif (video latents)")
    p.add_argument("--score", action="store_true",
                   help="digits: label the samples with a classifier trained on real digits")
    p.add_argument("--device", default="cpu", help="torch device to sample on")
    p.add_argument("--num-threads", type=int, default=None,
                   help="CPU threads (default: the run's device.num_threads, as in training)")
    p.set_defaults(func=run)


def run(args, extra) -> int:
    """Sample and write the file; prints a one-line summary (and the score)."""
    import json

    from loong_diffusion.generate import generate

    result = generate(args)
    print(json.dumps(result, indent=1))
    return 0
