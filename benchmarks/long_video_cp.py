"""A 64k-token multimodal sample under context parallelism: peak RSS per rank and step time.

Writes a LLaVA JSONL set of a few long frame-list videos (handwritten digits from scikit-learn
drifting across ``--size`` x ``--size`` frames, one question and answer each), then trains the
Qwen2.5-VL toy (``experiment=qwen2_5_vl_debug``, decoder narrowed to ``--hidden`` with 2 heads so
the 64k-token attention fits the CPU's time) on it for ``--steps`` steps with
``parallel.context_parallel_size=--cp`` over ``--nproc`` ranks, the kk_swap data balancer on
and no packing (one video per sequence). With the defaults each video is 126 frames of 256 x 256
pixels: 63 temporal patches x 32 x 32 merged tokens = 64,512 vision tokens, plus the text, in a
65,536-token sequence.

Peak RSS is the largest resident set of any process of the run (``getrusage`` of the waited
children: the ranks and the launcher); ``max_mem_gib`` is what rank 0 logs.

Usage: python benchmarks/long_video_cp.py [--cp 2] [--nproc 2] [--frames 126] [--size 256]
       [--seq 65536] [--steps 3] [--hidden 32] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_videos(root: Path, records: int, frames: int, size: int) -> Path:
    """``records`` videos of ``frames`` PNG frames each under ``root``; returns the JSONL file."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    (root / "frames").mkdir(parents=True, exist_ok=True)
    lines = []
    for r in range(records):
        digit = digits.images[r] * (255.0 / 16.0)
        files = []
        for f in range(frames):
            canvas = np.zeros((16, 16), dtype=np.float32)  # the 8x8 digit drifts over a 16x16 field
            x, y = (f * 8) // frames, (r * 3 + f // 16) % 8
            canvas[y:y + 8, x:x + 8] = digit
            name = f"frames/v{r}_{f:04d}.png"
            image = Image.fromarray(canvas.astype(np.uint8), mode="L")
            image.resize((size, size), resample=Image.Resampling.NEAREST).save(root / name)
            files.append(name)
        lines.append({"id": f"video{r}", "video": files, "conversations": [
            {"from": "human", "value": "<video>\nWhich digit moves in this video?"},
            {"from": "gpt", "value": str(int(digits.target[r]))}]})
    path = root / "videos.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def train(args, data: Path, run_dir: Path) -> tuple[float, subprocess.CompletedProcess]:
    """One ``loong train`` run; returns (peak RSS of any of its processes in GiB, the process)."""
    pixels = args.size * args.size
    overrides = [
        "experiment=qwen2_5_vl_debug", f"data.path={data}", "data.pack=false",
        f"data.seq_length={args.seq}", f"data.video_max_frames={args.frames}",
        f"data.video_max_pixels={pixels}", f"data.video_min_pixels={pixels}", "data.balancer=kk_swap",
        f"model.foundation.hidden_size={args.hidden}", "model.foundation.num_attention_heads=2",
        "model.foundation.num_query_groups=1", f"model.foundation.ffn_hidden_size={2 * args.hidden}",
        f"model.foundation.max_position_embeddings={args.seq}",
        f"parallel.context_parallel_size={args.cp}",
        "trainer.micro_batch_size=1", f"trainer.global_batch_size={args.nproc // args.cp}",
        f"trainer.train_iters={args.steps}", "trainer.log_interval=1", "trainer.eval_interval=0",
        "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.save_at_end=false",
        f"trainer.run_dir={run_dir}",
    ]
    command = ["loong", "train", *overrides, "--nproc-per-node", str(args.nproc)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak_kib / 2 ** 20, proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--frames", type=int, default=126)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--seq", type=int, default=65536)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--records", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="long_video_cp_"))
    data = write_videos(root / "data", args.records, args.frames, args.size)
    vision_tokens = (args.frames // 2) * (args.size // 8) ** 2  # 4x4 patches, 2x2 merge, 2 frames
    os.environ.setdefault("LOONG_CACHE", str(root / "cache"))
    start = time.perf_counter()
    peak, proc = train(args, data, root / "run")
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"training failed (exit {proc.returncode}); run directory {root / 'run'}")
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("split") == "train"]
    times = [r["step_time"] for r in rows]
    print(f"{args.frames} frames of {args.size}x{args.size} px = {vision_tokens} vision tokens, "
          f"seq {args.seq}, CP{args.cp} on {args.nproc} ranks, decoder hidden {args.hidden}")
    print("| step | loss | step time (s) | rank-0 max_mem_gib |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {r['loss']:.4f} | {r['step_time']:.1f} | {r['max_mem_gib']:.2f} |")
    later = times[1:] or times
    print(f"peak RSS of any process: {peak:.2f} GiB; median step time after the first: "
          f"{statistics.median(later):.1f} s; wall {wall:.0f} s (start-up and data included)")


if __name__ == "__main__":
    main()
