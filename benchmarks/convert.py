"""Throughput and peak memory of `loong convert` against plain safetensors read + write.

Builds a bf16 checkpoint of a published configuration with random weights (default Qwen3-0.6B:
28 layers, hidden 1024, vocab 151936, tied embeddings; ~1.2 GB in three shards), then times

* plain: every shard read with ``safetensors.torch.load_file`` and written with ``save_file``;
* ``loong convert hf-to-loong`` (the loong checkpoint keeps fp32 master weights: it writes about
  twice the bytes it reads);
* ``loong convert loong-to-hf`` back to bf16 safetensors (and checks the round trip bit-exact).

Each conversion is a fresh process; peak memory is its maximum resident set size
(``/usr/bin/time``-style ``ru_maxrss`` of the child). Throughput is the HF checkpoint's size
divided by the wall time, the same measure for all three rows.

Usage: python benchmarks/convert.py [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def build_checkpoint(directory: Path) -> int:
    """Write the random bf16 checkpoint (sharded, with an index); returns its tensor bytes."""
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    config = tf.Qwen3Config(**QWEN3_0P6B, dtype="bfloat16")
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


def run_child(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` and return ``(seconds, peak RSS GB)`` using wait4's resource usage."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr.decode()[-3000:]}")
    return elapsed, usage.ru_maxrss / 2**20  # KiB -> GiB on Linux


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
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="loong_convert_bench_"))
    src = work / "hf_bf16"
    try:
        if not src.is_dir():
            size = build_checkpoint(src)
        else:
            size = json.loads((src / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
        gb = size / 1e9
        py = [sys.executable, "-c"]
        rows = []
        plain = (f"import sys; from pathlib import Path; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                 f"import convert; convert.plain_copy(Path({str(src)!r}), Path({str(work / 'plain')!r}))")
        shutil.rmtree(work / "plain", ignore_errors=True)
        rows.append(("safetensors read + write", *run_child([*py, plain])))
        loong = [sys.executable, "-m", "loong_core.cli.main", "convert"]
        shutil.rmtree(work / "ckpt", ignore_errors=True)
        rows.append(("loong convert hf-to-loong", *run_child([*loong, "hf-to-loong", "--family", "qwen3",
                                                             str(src), str(work / "ckpt")])))
        shutil.rmtree(work / "back", ignore_errors=True)
        rows.append(("loong convert loong-to-hf", *run_child([*loong, "loong-to-hf", str(work / "ckpt"),
                                                             str(work / "back")])))
        exact = same_tensors(src, work / "back")
        base = rows[0][1]
        print(f"checkpoint: Qwen3-0.6B config, random bf16 weights, {gb:.2f} GB in "
              f"{len(list(src.glob('*.safetensors')))} shards; {os.cpu_count()} CPUs")
        print(f"{'step':<28}{'seconds':>9}{'MB/s':>9}{'vs plain':>10}{'peak RSS GB':>13}{'RSS / model':>13}")
        for name, seconds, rss in rows:
            print(f"{name:<28}{seconds:>9.1f}{size / 1e6 / seconds:>9.0f}{base / seconds:>10.2f}"
                  f"{rss:>13.2f}{rss * 2**30 / size:>13.2f}")
        print(f"round trip bit-exact in bf16: {exact}")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
