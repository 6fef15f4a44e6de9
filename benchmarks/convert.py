"""Throughput and peak memory of `loong convert` against plain safetensors read + write.

Builds a bf16 checkpoint of a published configuration with random weights (Qwen3-0.6B: 28
layers, hidden 1024, vocab 151936; by default with its output layer untied from the embedding,
1.50 GB in three shards, the size the issue asks for; ``--tied`` gives the published 1.19 GB
model), then times

* plain: every shard read with ``safetensors.torch.load_file`` and written with ``save_file``;
* ``loong convert hf-to-loong`` (streaming, weights only; the loong checkpoint keeps the source's
  bf16);
* ``loong convert loong-to-hf`` back to bf16 safetensors (and checks the round trip bit-exact).

Each row is a fresh process; peak memory is its maximum resident set size (``/usr/bin/time``-style
``ru_maxrss`` of the child). Throughput is the HF checkpoint's size divided by the time, the same
measure for all three rows, twice: over the process's wall time (with Python start-up, imports
and interpreter exit: torch for the plain row, torch + megatron-core + the plugins for ``loong
convert``), and over the work alone (the time each command reports for its conversion, the plain
row's load + save; imports are outside it in every row).

The rows run interleaved for ``--rounds`` rounds (default 3) and the table shows each column's
median, so a busy moment of a shared machine weighs on every row alike. Before each row the page
cache is flushed (``os.sync``, not timed), so no row pays for writing back the previous row's
output: no row syncs its own output, each measures writing into the page cache.

Usage: python benchmarks/convert.py [--workdir DIR] [--keep] [--rounds N] [--tied]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Qwen3-0.6B's published config.json (architecture fields).
QWEN3_0P6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
SHARD_BYTES = 500 * 2**20


def build_checkpoint(directory: Path, tied: bool = False) -> int:
    """Write the random bf16 checkpoint (sharded, with an index); returns its tensor bytes."""
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    config = tf.Qwen3Config(**{**QWEN3_0P6B, "tie_word_embeddings": tied}, dtype="bfloat16")
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(config)
    names = [n for n in model.state_dict() if not (config.tie_word_embeddings and n == "lm_head.weight")]
    generator = torch.Generator().manual_seed(0)
    directory.mkdir(parents=True)
    shard, shard_bytes, weight_map, total, index = {}, 0, {}, 0, 1

    def flush():
        nonlocal shard, shard_bytes, index
        name = f"model-{index:05d}.safetensors"
        save_file(shard, str(directory / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
        shard, shard_bytes, index = {}, 0, index + 1

    for name in names:
        meta = model.state_dict()[name]
        tensor = (torch.randn(meta.shape, generator=generator) * 0.02).to(torch.bfloat16)
        if shard and shard_bytes + tensor.nbytes > SHARD_BYTES:
            flush()
        shard[name] = tensor
        shard_bytes += tensor.nbytes
        total += tensor.nbytes
    flush()
    count = index - 1
    renamed = {}
    for old in sorted(set(weight_map.values())):  # model-0000i-of-0000n.safetensors, as published
        new = old.replace(".safetensors", f"-of-{count:05d}.safetensors")
        os.replace(directory / old, directory / new)
        renamed[old] = new
    index_json = {"metadata": {"total_size": total}, "weight_map": {k: renamed[v] for k, v in weight_map.items()}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2))
    config.save_pretrained(str(directory))
    return total


def plain_copy(src: Path, dst: Path) -> None:
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True)
    for path in sorted(src.glob("*.safetensors")):
        save_file(load_file(str(path)), str(dst / path.name), metadata={"format": "pt"})


def run_child(cmd: list[str]) -> tuple[float, float, float]:
    """Run ``cmd`` and return ``(wall seconds, work seconds, peak RSS GB)`` using wait4's resource
    usage; the work seconds are the last ``in Xs`` the command prints."""
    import re

    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE)
        stderr = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        out.seek(0)
        stdout = out.read().decode()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr.decode()[-3000:]}")
    work = [float(x) for x in re.findall(r" in ([0-9.]+)s", stdout)]
    return elapsed, work[-1] if work else float("nan"), usage.ru_maxrss / 2**20  # KiB -> GiB


def same_tensors(a: Path, b: Path) -> bool:
    """Same names, dtypes and bits in two safetensors directories."""
    import torch
    from safetensors import safe_open

    def read(directory):
        out = {}
        for path in sorted(directory.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                out.update({k: f.get_tensor(k) for k in f.keys()})
        return out

    ta, tb = read(a), read(b)
    return sorted(ta) == sorted(tb) and all(
        ta[k].dtype == tb[k].dtype and ta[k].view(-1).view(torch.uint8).equal(tb[k].view(-1).view(torch.uint8))
        for k in ta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the files")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three rows (medians shown)")
    parser.add_argument("--tied", action="store_true",
                        help="the published tied-embedding model (1.19 GB) instead of untied (1.50 GB)")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="loong_convert_bench_"))
    src = work / ("hf_bf16_tied" if args.tied else "hf_bf16")
    try:
        py = [sys.executable, "-c"]
        here = f"import sys; from pathlib import Path; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        if not src.is_dir():  # in a child: this process stays small (a child's peak RSS counts
            # the parent's at fork time on Linux)
            subprocess.run([*py, here + f"import convert; convert.build_checkpoint(Path({str(src)!r}), "
                            f"{args.tied})"], check=True)
        size = json.loads((src / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
        gb = size / 1e9
        plain = (here + f"import convert, time, safetensors.torch; t = time.perf_counter(); "
                 f"convert.plain_copy(Path({str(src)!r}), Path({str(work / 'plain')!r})); "
                 f"print(f' in {{time.perf_counter() - t:.2f}}s')")
        loong = [sys.executable, "-m", "loong_core.cli.main", "convert"]
        arms = [("safetensors read + write", work / "plain", [*py, plain]),
                ("loong convert hf-to-loong", work / "ckpt",
                 [*loong, "hf-to-loong", "--family", "qwen3", str(src), str(work / "ckpt")]),
                ("loong convert loong-to-hf", work / "back",
                 [*loong, "loong-to-hf", str(work / "ckpt"), str(work / "back")])]
        runs: dict[str, list] = {name: [] for name, _, _ in arms}
        for _ in range(args.rounds):  # the arms interleaved, so a busy moment hits all of them
            for name, out, cmd in arms:
                shutil.rmtree(out, ignore_errors=True)
                os.sync()  # each row starts with no dirty pages of the row before (untimed):
                # the disk writes ~200 MB/s here, and a backlog throttles whoever writes next
                runs[name].append(run_child(cmd))
        rows = [(name, *(statistics.median(r[i] for r in runs[name]) for i in range(3)))
                for name, _, _ in arms]
        exact = same_tensors(src, work / "back")
        base, base_work = rows[0][1], rows[0][2]
        ckpt_bytes = sum(p.stat().st_size for p in (work / "ckpt").glob("*.distcp"))
        print(f"checkpoint: Qwen3-0.6B config ({'tied' if args.tied else 'untied'} embeddings), "
              f"random bf16 weights, {gb:.2f} GB in "
              f"{len(list(src.glob('*.safetensors')))} shards; loong checkpoint {ckpt_bytes / 1e9:.2f} GB; "
              f"{os.cpu_count()} CPUs")
        print(f"{'step':<28}{'wall s':>8}{'MB/s':>7}{'vs plain':>9}{'work s':>8}{'MB/s':>7}{'vs plain':>9}"
              f"{'peak RSS GB':>13}{'RSS / model':>13}")
        for name, seconds, work_s, rss in rows:
            print(f"{name:<28}{seconds:>8.1f}{size / 1e6 / seconds:>7.0f}{base / seconds:>9.2f}"
                  f"{work_s:>8.1f}{size / 1e6 / work_s:>7.0f}{base_work / work_s:>9.2f}"
                  f"{rss:>13.2f}{rss * 2**30 / size:>13.2f}")
        print(f"round trip bit-exact in bf16: {exact}; medians of {args.rounds} interleaved rounds")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
