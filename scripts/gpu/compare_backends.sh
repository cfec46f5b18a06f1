#!/usr/bin/env bash
# FlashInfer against Triton (both with CUDA graphs) on a second model shape: head size 128
# with four query heads per KV head (Llama 3 8B's attention, hidden 4096, MLP 14,336; 4
# layers are enough, since every layer costs the same), the default model's tokenizer and
# vocabulary, random weights. Run on the GPU machine from the repository root with
# .gpu_carry/ carried, like scripts/gpu_check.sh; writes compare.log and bench_gpu.* into
# $OUT. About 3 minutes, most of them FlashInfer's first build for head size 128.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/compare.log") 2>&1
export PYTHONUNBUFFERED=1 PY=${PY:-python3}
unset TRITON_INTERPRET
START=$(date +%s)
# shellcheck source=scripts/gpu/install_deps.sh
. scripts/gpu/install_deps.sh || exit 1
SHAPE=/tmp/forkserve-shape-h128
rm -rf "$SHAPE" && cp -r .gpu_carry/smollm2_shape "$SHAPE"
"$PY" - "$SHAPE/config.json" <<'PYEOF'
import json, sys
path = sys.argv[1]
config = json.load(open(path))
config.update(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
              head_dim=128, num_hidden_layers=4)
json.dump(config, open(path, "w"), indent=2)
PYEOF
echo "=== [$(($(date +%s) - START))s] stand-in"
"$PY" scripts/gpu/make_standin_model.py "$SHAPE" /tmp/forkserve-standin-h128 || exit 1
echo "=== [$(($(date +%s) - START))s] benchmark"
MAX_JOBS=16 "$PY" -m bench_agent.bench_gpu --model-dir /tmp/forkserve-standin-h128 --out "$OUT" \
  --backends triton flashinfer --quick
echo "=== [$(($(date +%s) - START))s] done"
