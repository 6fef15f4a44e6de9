"""``loong eval vqa``: greedy answers and exact-match accuracy of a trained VLM.

Light at import time: torch, megatron-core and the model load when the command runs.
"""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    """Add the ``vqa`` action to the shared ``loong eval`` command (core passes its subparsers)."""
    p = subparsers.add_parser(
        "vqa",
        help="exact-match accuracy of a trained VLM's greedy answers",
        description="Rebuild a VLM and its dataset from a loong run (config.yaml + checkpoints/iter_N) on one "
        "process, answer each evaluation record greedily (the conversation up to its last assistant reply, "
        "images included, decoded until end of turn) and print the exact-match accuracy (after strip) with a "
        "few (prompt, expected, got) rows. Without --data it evaluates the run's own split.",
    )
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="run directory (its newest checkpoint) or a checkpoint directory iter_N inside it")
    p.add_argument("--data", default=None, metavar="FILE",
                   help="LLaVA .json/.jsonl records to evaluate (llava runs; default: the run's --split)")
    p.add_argument("--image-root", default=None, metavar="DIR",
                   help="folder relative image paths of --data start from (default: the file's folder)")
    p.add_argument("--split", default="valid", choices=("valid", "train"), help="the run's split (default valid)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="decoding limit per answer (default: 32; 1 for digits runs trained on the digit only)")
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N records only")
    p.add_argument("--batch-size", type=int, default=32,
                   help="questions answered together where the data allows (equal-length prompts; default 32)")
    p.add_argument("--show", type=int, default=5, help="example rows to print (default 5)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)


def run(args, extra) -> int:
    """Load the run, evaluate, print the accuracy (or JSON)."""
    from loong_vlm.eval.loading import load_vlm
    from loong_vlm.eval.vqa import evaluate

    vlm = load_vlm(args.checkpoint)
    result = evaluate(vlm, args.split, args.data, args.image_root, args.max_new_tokens, args.limit, args.show,
                      args.batch_size)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['checkpoint']} on {result['dataset']} ({result['source']}): accuracy "
          f"{result['accuracy']:.4f} ({result['correct']}/{result['count']}), {result['seconds']} s")
    for row in result["examples"]:
        mark = "ok " if row["correct"] else "BAD"
        print(f"  {mark} {row['where']}: {row['prompt']!r} expected {row['expected']!r} got {row['got']!r}")
    return 0
