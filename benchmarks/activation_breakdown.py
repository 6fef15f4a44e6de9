"""What a training step keeps for backward, by module: bytes per token of one rank.

Runs one step of ``loong train experiment=llama_debug`` in this process (one rank, so CP1) at one
sequence length, with a ``saved_tensors_hooks`` pair that records every tensor autograd saves
under the innermost module running when it was saved (global module forward hooks), and follows
it until autograd releases it (each storage counted once while any saved view of it lives). The
table is the live saved memory at its peak over the step (with full recompute that is during the
backward: the checkpointed layer inputs plus one recomputed layer), by module. The step's
workspace (logit gradients, attention backward buffers, the optimizer step) comes on top: it is
the rest of ``act`` in ``benchmarks/long_context.py``.

Usage: python benchmarks/activation_breakdown.py [--seq 8192] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import weakref
from collections import defaultdict

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    stack: list[str] = []
    live: dict[str, int] = defaultdict(int)  # module -> bytes saved and not yet released
    holders: dict[int, list] = {}  # storage address -> [saved tensors alive, bytes, module]
    peak = {"total": 0, "by_module": {}}

    def pre(module, inputs):
        stack.append(type(module).__name__)

    def post(module, inputs, output):
        stack.pop()

    def release(key):
        entry = holders[key]
        entry[0] -= 1
        if entry[0] == 0:
            live[entry[2]] -= entry[1]
            del holders[key]

    def pack(tensor):
        if isinstance(tensor, torch.nn.Parameter) or tensor.device.type == "meta":
            return tensor
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in holders:
            holders[key] = [0, storage.nbytes(), stack[-1] if stack else "(outside modules)"]
            live[holders[key][2]] += storage.nbytes()
        holders[key][0] += 1
        weakref.finalize(tensor, release, key)
        total = sum(live.values())
        if total > peak["total"]:
            peak.update(total=total, by_module=dict(live))
        return tensor

    from loong_core import runtime

    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [
            "experiment=llama_debug", f"data.seq_length={args.seq}", f"model.max_position_embeddings={args.seq}",
            "trainer.micro_batch_size=1", "trainer.global_batch_size=1", "trainer.train_iters=1",
            "trainer.eval_interval=0", "trainer.eval_at_start=false", "trainer.save_at_end=false",
            "trainer.progress_bar=false", "trainer.tensorboard=false", f"trainer.run_dir={run_dir}", *args.extra]
        handles = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
                   torch.nn.modules.module.register_module_forward_hook(post)]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            runtime.train(overrides)
        for handle in handles:
            handle.remove()
    total = peak["total"]
    print(f"seq {args.seq}, overrides: {' '.join(args.extra) or '(none)'}")
    print("| module (innermost) | MiB saved at the peak | bytes/token |")
    print("|---|---|---|")
    for name, size in sorted(peak["by_module"].items(), key=lambda kv: -kv[1]):
        if size > 0:
            print(f"| {name} | {size / 2**20:.1f} | {size / args.seq:.0f} |")
    print(f"| total | {total / 2**20:.1f} | {total / args.seq:.0f} |")


if __name__ == "__main__":
    main()
