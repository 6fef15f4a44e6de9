"""The Python part of ``benchmarks/gpu/train_check.sh``: real ``loong train`` runs on one GPU.

Parts (each prints a small table):

* ``llama``: 30 steps of a ~100M-parameter Llama (12 layers x 768, GQA 12/4, SwiGLU 2048,
  vocabulary 4096, sequence 1024, batch 8) in bf16 on the megatron engine: loss first -> last,
  median tokens/s and MFU after the first 5 steps;
* ``dit``: 30 steps of ``dit_digits`` on the torch engine in bf16: loss, samples/s, MFU;
* ``bf16``: the bf16-vs-fp32 check of ``loong_llm/tests/test_mixed_precision.py`` at the llama size:
  one initial checkpoint, 10 steps in fp32 and in bf16 from it, the worst per-step relative loss
  difference against one bf16 unit (2^-8).
* ``moe`` (not in the default parts; about 2 minutes): a DeepSeek-V3-style MoE with a shared expert
  (16 experts top-4, hidden 1024, sequence 1024, bf16) from one initial checkpoint, 20 steps with
  ``model.moe_shared_expert_overlap`` false and true: per-step losses (within a bf16 unit: the
  overlap adds the router's and the shared expert's gradients in another order), median tokens/s,
  and, from a ``trainer.profile`` trace of the overlapped run, whether GPU kernels ran on more than
  one CUDA stream at the same time (the shared expert on megatron-core's side stream).

``--dry-run`` runs the same code on CPU at tiny sizes (a handful of steps) to check the script.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from loong_core.testing import read_metrics, run_train

LLAMA_100M = ["model.hidden_size=768", "model.num_layers=12", "model.num_attention_heads=12",
              "model.num_query_groups=4", "model.ffn_hidden_size=2048", "data.seq_length=1024",
              "trainer.micro_batch_size=8", "trainer.global_batch_size=8"]
LLAMA_TINY = ["model.hidden_size=64", "model.num_layers=2", "model.num_attention_heads=4",
              "model.num_query_groups=2", "model.ffn_hidden_size=128", "data.seq_length=64",
              "trainer.micro_batch_size=2", "trainer.global_batch_size=2"]
QUIET = ["trainer.log_interval=1", "trainer.eval_interval=0", "trainer.eval_at_start=false",
         "trainer.progress_bar=false", "trainer.tensorboard=false"]
BF16_UNIT = 2.0 ** -8
MOE_GPU = ["model.num_layers=4", "model.hidden_size=1024", "model.num_attention_heads=8", "model.ffn_hidden_size=2816",
           "model.q_lora_rank=256", "model.kv_lora_rank=128", "model.qk_head_dim=64", "model.qk_pos_emb_head_dim=32",
           "model.v_head_dim=64", "model.num_experts=16", "model.moe_router_topk=4", "model.moe_ffn_hidden_size=512",
           "model.moe_shared_expert_intermediate_size=1024", "model.moe_layer_freq=[0,1,1,1]",
           "model.moe_router_num_groups=4", "model.moe_router_group_topk=2", "data.seq_length=1024",
           "trainer.micro_batch_size=8", "trainer.global_batch_size=8"]


class Check:
    """Overrides and step counts of a GPU run or of the CPU dry run."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run
        self.device = "device=cpu" if dry_run else "device=cuda"
        self.llama = ["experiment=llama_shakespeare", *(LLAMA_TINY if dry_run else LLAMA_100M)]
        self.dit = ["experiment=dit_digits_debug" if dry_run else "experiment=dit_digits"]
        self.moe = ["experiment=deepseek_v3_debug", *([] if dry_run else MOE_GPU)]
        self.steps = 3 if dry_run else 30
        self.compare_steps = 3 if dry_run else 10
        self.warmup = 1 if dry_run else 5

    def train(self, base: list[str], run_dir: Path, *extra: str) -> list[dict]:
        run_train([*base, self.device, *QUIET, f"trainer.run_dir={run_dir}", *extra], timeout=600)
        return sorted(read_metrics(run_dir), key=lambda r: r["step"])


def _summary(name: str, records: list[dict], warmup: int, rate_key: str) -> str:
    timed = records[warmup:] or records
    rate = statistics.median(r[rate_key] for r in timed)
    mfus = [r["mfu"] for r in timed if r.get("mfu") is not None]
    mfu = f"{100 * statistics.median(mfus):.1f}%" if mfus else "n/a"
    mem = max((r.get("max_mem_gib") or 0.0) for r in records)
    return (f"{name:<34}{records[0]['loss']:>9.4f}{records[-1]['loss']:>9.4f}{rate:>12.0f} "
            f"{rate_key.replace('_per_sec', '/s'):<10}{mfu:>7}{mem:>9.2f}")


HEADER = f"{'run':<34}{'loss 1':>9}{'loss N':>9}{'rate':>12} {'unit':<10}{'MFU':>7}{'mem GiB':>9}"


def llama(check: Check, root: Path) -> bool:
    records = check.train(check.llama, root / "llama_bf16", f"trainer.train_iters={check.steps}",
                          "trainer.save_at_end=false", "parallel.mixed_precision=bf16")
    print(HEADER)
    size = "tiny" if check.dry_run else "~100M"
    print(_summary(f"llama {size} bf16 megatron x{check.steps}", records, check.warmup, "tokens_per_sec"))
    return records[-1]["loss"] < records[0]["loss"]


def dit(check: Check, root: Path) -> bool:
    records = check.train(check.dit, root / "dit_bf16", f"trainer.train_iters={check.steps}",
                          "trainer.save_at_end=false", "parallel.mixed_precision=bf16",
                          "trainer.save_interval=0")
    key = "samples_per_sec" if "samples_per_sec" in records[0] else "tokens_per_sec"
    print(HEADER)
    print(_summary(f"dit_digits bf16 torch x{check.steps}", records, check.warmup, key))
    return records[-1]["loss"] < records[0]["loss"]


def bf16(check: Check, root: Path) -> bool:
    check.train(check.llama, root / "init", "trainer.train_iters=1", "optim.lr_warmup_iters=0")
    losses = {}
    for precision in ("fp32", "bf16"):
        records = check.train(check.llama, root / precision, f"trainer.train_iters={check.compare_steps}",
                              "trainer.save_at_end=false", f"trainer.init_from={root / 'init'}",
                              f"parallel.mixed_precision={precision}")
        losses[precision] = {r["step"]: r["loss"] for r in records}
    print(f"{'step':>5}{'fp32':>12}{'bf16':>12}{'rel diff':>12}")
    worst = 0.0
    for step, reference in sorted(losses["fp32"].items()):
        rel = abs(losses["bf16"][step] - reference) / abs(reference)
        worst = max(worst, rel)
        print(f"{step:>5}{reference:>12.5f}{losses['bf16'][step]:>12.5f}{rel:>12.2e}")
    ok = worst <= BF16_UNIT
    print(f"worst relative difference {worst:.2e} vs one bf16 unit {BF16_UNIT:.2e}: {'PASS' if ok else 'FAIL'}")
    return ok


def _overlapping_streams(trace: Path) -> tuple[int, bool]:
    """``(CUDA streams with kernels, whether kernels of two streams overlap in time)`` of a trace."""
    import json

    kernels = [e for e in json.loads(trace.read_text())["traceEvents"]
               if e.get("cat") == "kernel" and e.get("ph") == "X"]
    by_stream: dict = {}
    for event in kernels:
        by_stream.setdefault(event.get("args", {}).get("stream"), []).append((event["ts"], event["ts"] + event["dur"]))
    spans = sorted((start, end, stream) for stream, items in by_stream.items() for start, end in items)
    overlap, latest = False, {}
    for start, end, stream in spans:
        if any(other != stream and finish > start for other, finish in latest.items()):
            overlap = True
            break
        latest[stream] = max(latest.get(stream, 0), end)
    return len(by_stream), overlap


def moe(check: Check, root: Path) -> bool:
    steps = 5 if check.dry_run else 20
    check.train(check.moe, root / "init", "trainer.train_iters=1", "optim.lr_warmup_iters=0")
    runs = {}
    for overlap in (False, True):
        profile = (["trainer.profile=true", f"trainer.profile_step_start={steps - 2}",
                    f"trainer.profile_step_end={steps}"] if overlap else [])
        runs[overlap] = check.train(check.moe, root / f"overlap_{overlap}", f"trainer.train_iters={steps}",
                                    "trainer.save_at_end=false", f"trainer.init_from={root / 'init'}",
                                    "parallel.mixed_precision=bf16", f"model.moe_shared_expert_overlap={overlap}",
                                    *profile)
    print(HEADER)
    for overlap, records in runs.items():
        print(_summary(f"moe shared-expert overlap={overlap}", records, check.warmup, "tokens_per_sec"))
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(runs[False], runs[True]))
    print(f"worst per-step relative loss difference {worst:.2e} (one bf16 unit {BF16_UNIT:.2e})")
    traces = sorted((root / "overlap_True" / "profile").glob("rank0.*.pt.trace.json"))
    ok = worst <= BF16_UNIT and len(traces) == 1
    if traces and not check.dry_run:
        streams, overlapped = _overlapping_streams(traces[0])
        print(f"profile of steps {steps - 2}-{steps - 1}: kernels on {streams} CUDA stream(s), "
              f"{'kernels of two streams overlap' if overlapped else 'no two streams overlap'}")
        ok = ok and streams > 1 and overlapped
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", help="llama, dit, bf16 (default: all three), moe")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU")
    args = parser.parse_args()
    parts = args.parts or ["llama", "dit", "bf16"]
    unknown = sorted(set(parts) - {"llama", "dit", "bf16", "moe"})
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from llama, dit, bf16, moe")
    check = Check(args.dry_run)
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            print(f"-- {part}{' (dry run on CPU)' if args.dry_run else ''}", flush=True)
            try:
                ok = globals()[part](check, Path(tmp) / part)
            except AssertionError as exc:  # run_train's failure, with the run's output
                print(str(exc)[-4000:])
                ok = False
            print(f"{part}: {'ok' if ok else 'FAILED'}", flush=True)
            status |= not ok
    return status


if __name__ == "__main__":
    sys.exit(main())
