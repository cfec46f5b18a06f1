#!/usr/bin/env bash
# The GPU check: run on the GPU machine from the repository root, with .gpu_carry/ carried
# (made here by scripts/gpu/fetch_deps.sh). Fits in about 9 minutes; every phase has its
# own time limit (the total stays under ~9.5 minutes) and a failing phase does not stop
# the later ones. Writes into $OUT (or
# ./gpu_out): gpu_check.log, pytest logs and junit XML, FlashInfer build logs,
# bench_gpu.json and bench_gpu.md. See docs/gpu.md.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 PY=${PY:-python3}
unset TRITON_INTERPRET  # the GPU tests need compiled kernels
START=$(date +%s)
TOTAL=580         # seconds for the whole script
BENCH_RESERVE=170 # kept for the benchmark, which runs last on a quiet CPU
elapsed() { echo $(($(date +%s) - START)); }
stamp() { echo "=== [$(($(date +%s) - START))s] $*"; }
status=0
phase() {  # phase NAME SECONDS COMMAND...: run with a time limit, remember failures
  local name=$1 limit=$2; shift 2
  stamp "$name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  [ $rc -eq 0 ] || { echo "!!! $name failed with exit code $rc"; status=1; }
  return $rc
}

stamp "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
command -v nvcc && nvcc --version | tail -2

stamp "install carried wheels and the repository"
# shellcheck source=scripts/gpu/install_deps.sh
. scripts/gpu/install_deps.sh || status=1
HAVE_FLASHINFER=$("$PY" -c "import flashinfer" 2>/dev/null && echo 1 || echo 0)

MODEL=/tmp/forkserve-smollm2-standin
phase "stand-in model (default model's shape, random weights)" 120 \
  "$PY" scripts/gpu/make_standin_model.py .gpu_carry/smollm2_shape "$MODEL"
export FORKSERVE_GPU_MODEL_DIR=$MODEL

# FlashInfer compiles its kernels with nvcc on first use: start those builds now, one
# process per head size, while the Triton and torch_native tests run (6 compile jobs each,
# leaving cores for the tests).
WARM_PIDS=()
if [ "$HAVE_FLASHINFER" = 1 ]; then
  stamp "FlashInfer builds started in the background"
  MAX_JOBS=6 timeout 330 "$PY" scripts/gpu/warm_flashinfer.py 64 3 8 >"$OUT/flashinfer_build_64.log" 2>&1 &
  WARM_PIDS+=($!)
  MAX_JOBS=6 timeout 330 "$PY" scripts/gpu/warm_flashinfer.py 128 1 4 >"$OUT/flashinfer_build_128.log" 2>&1 &
  WARM_PIDS+=($!)
else
  echo "!!! flashinfer is not importable: its tests will skip and it is left out of the benchmark"
  status=1
fi

# Torch's CPU threads are capped meanwhile: the tests' float32 references run on the host,
# and an OpenMP team of 16 threads sharing cores with 12 compile jobs waits at every barrier
# (the first run spent 110 s in torch_native's extend tests this way).
phase "GPU tests without FlashInfer" 220 \
  env OMP_NUM_THREADS=4 "$PY" -m pytest tests/gpu -m gpu -k "not flashinfer" -q -rs -s -p no:cacheprovider \
  --junitxml="$OUT/pytest_triton.xml"

if [ "$HAVE_FLASHINFER" = 1 ]; then
  stamp "waiting for the FlashInfer builds"
  for pid in "${WARM_PIDS[@]}"; do wait "$pid" || { echo "!!! a FlashInfer build failed (see flashinfer_build_*.log)"; status=1; }; done
  tail -n 3 "$OUT"/flashinfer_build_*.log
  limit=$((TOTAL - BENCH_RESERVE - $(elapsed)))
  if [ $limit -ge 45 ]; then
    phase "GPU tests with FlashInfer" "$limit" \
      "$PY" -m pytest tests/gpu -m gpu -k "flashinfer" -q -rs -s -p no:cacheprovider \
      --junitxml="$OUT/pytest_flashinfer.xml"
  else
    echo "!!! no time left for the FlashInfer tests"; status=1
  fi
  BACKENDS="flashinfer triton"
else
  BACKENDS="triton"
fi

remaining=$((TOTAL - $(elapsed)))
[ $remaining -ge 90 ] || remaining=90
# shellcheck disable=SC2086
phase "benchmark" "$remaining" "$PY" -m bench_agent.bench_gpu --model-dir "$MODEL" --out "$OUT" --backends $BACKENDS

stamp "done, status $status"
exit $status
