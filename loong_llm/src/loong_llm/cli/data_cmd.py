"""``loong data preprocess``: tokenize text / jsonl / parquet into a megatron-core indexed dataset.

Imports nothing heavy at import time (``loong --help`` stays fast); the work happens in
:mod:`loong_llm.data.preprocess`.
"""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    """Add the ``preprocess`` action to the shared ``loong data`` command."""
    pre = subparsers.add_parser(
        "preprocess",
        help="text / jsonl / parquet -> megatron-core indexed dataset (.bin/.idx)",
        description="Tokenize documents into PREFIX.bin/.idx, saving the tokenizer in "
        "PREFIX.tokenizer/ and counts in PREFIX.meta.json. Train on it with "
        "data=indexed data.prefix=PREFIX.",
    )
    pre.add_argument("inputs", nargs="+", metavar="FILE", help="input files (.txt, .jsonl, .parquet, .gz)")
    pre.add_argument("-o", "--output-prefix", required=True, help="output path without extension")
    pre.add_argument("--tokenizer", default=None,
                     help="Hugging Face tokenizer.json or tokenizer directory (default: train a BPE)")
    pre.add_argument("--vocab-size", type=int, default=32768,
                     help="vocabulary of the BPE trained when --tokenizer is not given (default 32768)")
    pre.add_argument("--format", choices=("text", "jsonl", "parquet"), default=None,
                     help="input format (default: from each file's extension)")
    pre.add_argument("--json-key", default="text", help="JSON key / parquet column of the text (default text)")
    pre.add_argument("--text-docs", choices=("file", "paragraph", "line"), default="file",
                     help="raw text: one document per file, blank-line paragraph or line (default file)")
    pre.add_argument("--workers", type=int, default=1, help="tokenizer processes (default 1)")
    pre.add_argument("--no-progress", action="store_true", help="no progress bar")
    pre.set_defaults(func=run_preprocess)


def run_preprocess(args, extra) -> int:
    """Run ``loong data preprocess``; prints the metadata as JSON."""
    import sys

    from loong_llm.data.preprocess import preprocess

    meta = preprocess(
        args.inputs,
        args.output_prefix,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        fmt=args.format,
        key=args.json_key,
        text_docs=args.text_docs,
        workers=args.workers,
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    print(json.dumps(meta, indent=2))
    return 0
