"""How full packed sequences are under each ``data.pack_algorithm``: positions used / positions.

Rows (each the mean over ``--shuffles`` epochs, shuffled as the datasets shuffle them):

- ``vlm peers``: the 160 LLaVA records of ``benchmarks/peers_vlm.py`` (one image of 56..448 px
  per record, so 36..310 positions) at ``--vlm-seq`` positions (1,024: that benchmark's);
- ``chat``: the chatterbot conversations of ``experiment=llama_sft_debug`` (its tokenizer,
  trained once into the data cache) at ``--chat-seq`` positions;
- ``uniform``: ``--uniform`` lengths drawn uniformly from 1..``--seq`` / 2 at ``--seq``.

Per row: the items, the sequences each algorithm makes, their fill and how many fewer steps an
epoch takes with ``best_fit``. Fill decides the cost of an epoch: every position of a sequence
goes through the model, padded or not.

Usage: python benchmarks/packing_fill.py [--shuffles 5] [--vlm-seq 1024] [--chat-seq 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

ALGORITHMS = ("next_fit", "best_fit")


def vlm_sizes(seq: int) -> list[int]:
    """Positions of each LLaVA record of the VLM peers benchmark."""
    import peers_vlm

    shape = dict(peers_vlm.SHAPES["default"], seq=seq)
    module = peers_vlm._loong_data(shape, peers_vlm._records(shape))
    return [module.layout.positions(record) for record in module.records["train"]]


def chat_sizes(seq: int) -> list[int]:
    """Positions of each chatterbot training conversation (``llama_sft_debug``'s data)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from loong_llm.data.chat_data import ChatDataModule
    from loong_llm.data.config import ChatDataConfig

    module = ChatDataModule(ChatDataConfig(name="chat", corpus="chatterbot", vocab_size=1024, seq_length=seq))
    module.prepare()
    conversations = IndexedDataset(str(module.data_dir / "train"))  # its index must outlive the read
    sizes = np.minimum(conversations.sequence_lengths.astype(np.int64), seq + 1) - 1
    return sizes[sizes >= 1].tolist()


def fill(sizes: list[int], seq: int, algorithm: str, shuffles: int) -> tuple[float, float, float]:
    """Mean sequences per epoch, mean fill and seconds per packing over ``shuffles`` shuffles."""
    from loong_llm.data.packing import pack

    counts, fills, seconds = [], [], []
    for epoch in range(shuffles):
        order = np.random.default_rng([0, epoch]).permutation(len(sizes))
        start = time.perf_counter()
        bins = pack([sizes[i] for i in order], seq, algorithm)
        seconds.append(time.perf_counter() - start)
        counts.append(len(bins))
        fills.append(sum(sizes) / (len(bins) * seq))
    return statistics.mean(counts), statistics.mean(fills), statistics.mean(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shuffles", type=int, default=5)
    parser.add_argument("--vlm-seq", type=int, default=1024)
    parser.add_argument("--chat-seq", type=int, default=128)
    parser.add_argument("--seq", type=int, default=4096, help="sequence of the uniform row")
    parser.add_argument("--uniform", type=int, default=100_000, help="items of the uniform row")
    args = parser.parse_args()
    rows = {f"vlm peers (seq {args.vlm_seq})": (vlm_sizes(args.vlm_seq), args.vlm_seq),
            f"chat (seq {args.chat_seq})": (chat_sizes(args.chat_seq), args.chat_seq),
            f"uniform 1..{args.seq // 2} (seq {args.seq})":
                (np.random.default_rng(0).integers(1, args.seq // 2 + 1, args.uniform).tolist(), args.seq)}
    print(f"mean of {args.shuffles} shuffles per row\n")
    print("| data | items | next_fit: sequences / fill | best_fit: sequences / fill | fewer steps per epoch "
          "| best_fit seconds per epoch |")
    print("|---|---|---|---|---|---|")
    for name, (sizes, seq) in rows.items():
        result = {a: fill(sizes, seq, a, args.shuffles) for a in ALGORITHMS}
        (n_next, f_next, _), (n_best, f_best, s_best) = result["next_fit"], result["best_fit"]
        print(f"| {name} | {len(sizes)} | {n_next:.1f} / {f_next:.1%} | {n_best:.1f} / {f_best:.1%} "
              f"| {1 - n_best / n_next:.1%} | {s_best:.3f} |")


if __name__ == "__main__":
    main()
