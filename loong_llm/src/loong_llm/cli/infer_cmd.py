"""``loong generate`` (greedy) and ``loong eval perplexity``: sanity checks of a model.

Nothing heavy is imported here; the work is in :mod:`loong_llm.hf.inference`.
"""

from __future__ import annotations

import json


def _model_args(p) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf", metavar="DIR", help="Hugging Face model directory")
    src.add_argument("--checkpoint", metavar="DIR", help="loong checkpoint directory")
    p.add_argument("--family", default=None, help="model family (default: from config.json)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json or its directory (default: the model's)")
    p.add_argument("--num-threads", type=int, default=None,
                   help="CPU threads (default: the run's device.num_threads, as in training)")


def _set_threads(args) -> None:
    """``--num-threads``, else the ``device.num_threads`` of the checkpoint's run (as training)."""

    import torch
    import yaml

    threads = args.num_threads
    if threads is None and args.checkpoint:
        from loong_core.checkpoint import store

        run_config = store.resolve_checkpoint(args.checkpoint).parent.parent / "config.yaml"
        if run_config.is_file():
            threads = (yaml.safe_load(run_config.read_text()).get("device") or {}).get("num_threads")
    if threads:
        torch.set_num_threads(int(threads))


def add_generate_parser(subparsers) -> None:
    """Add ``generate``."""
    p = subparsers.add_parser("generate", help="greedy text generation (sanity check)")
    _model_args(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.set_defaults(func=run_generate)


def add_perplexity_parser(subparsers) -> None:
    """Add ``perplexity`` under the shared ``loong eval`` command (registered as ``eval perplexity``)."""
    ppl = subparsers.add_parser("perplexity", help="perplexity of a text file (LLM)")
    _model_args(ppl)
    ppl.add_argument("--text", required=True, metavar="FILE")
    ppl.add_argument("--seq-length", type=int, default=512, help="window length (default 512)")
    ppl.add_argument("--json", action="store_true", help="print a JSON object")
    ppl.set_defaults(func=run_perplexity)


def run_generate(args, extra) -> int:
    """Print the prompt and its greedy continuation."""
    from loong_llm.hf.inference import generate, load

    _set_threads(args)
    lm = load(args.hf, args.checkpoint, args.family, args.tokenizer)
    print(args.prompt + generate(lm, args.prompt, args.max_new_tokens))
    return 0


def run_perplexity(args, extra) -> int:
    """Print ``perplexity: <value>`` (or JSON)."""
    from pathlib import Path

    from loong_llm.hf.inference import load, perplexity

    _set_threads(args)
    lm = load(args.hf, args.checkpoint, args.family, args.tokenizer)
    result = perplexity(lm, Path(args.text).read_text(), args.seq_length)
    print(json.dumps(result) if args.json else f"perplexity: {result['perplexity']:.4f}")
    return 0
