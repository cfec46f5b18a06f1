#!/usr/bin/env bash
# Run HERE, on a machine with the package registry and the default model installed.
# Gathers into .gpu_carry/ (git-ignored) what an offline GPU machine lacks, keeping the
# repository plus this folder under 64 MiB so both can be copied over together:
#   wheels/        flashinfer-python (repacked without other kernel families' sources, see
#                  slim_flashinfer_wheel.py), apache-tvm-ffi (FlashInfer's binding layer,
#                  compiled: built for the GPU machine's Python), pyzmq, platformdirs
#   smollm2_shape/ the default model's config and tokenizer files (no weights: its 98 MB
#                  GGUF does not fit; the GPU check builds a random-weight stand-in)
# Versions and the target Python can be overridden through the environment.
set -euo pipefail
cd "$(dirname "$0")/../.."

CARRY=.gpu_carry
GPU_PYTHON=${GPU_PYTHON:-3.12}
FLASHINFER_VERSION=${FLASHINFER_VERSION:-0.7.4}
TVM_FFI_VERSION=${TVM_FFI_VERSION:-0.1.15.post2}
PYZMQ_VERSION=${PYZMQ_VERSION:-27.3.0}
PLATFORMDIRS_VERSION=${PLATFORMDIRS_VERSION:-4.14.8}
PY=${PYTHON:-python3}

rm -rf "$CARRY" && mkdir -p "$CARRY/wheels" "$CARRY/download" "$CARRY/smollm2_shape"

"$PY" -m pip download -q --no-deps "flashinfer-python==$FLASHINFER_VERSION" -d "$CARRY/download"
"$PY" scripts/gpu/slim_flashinfer_wheel.py "$CARRY"/download/flashinfer_python-*.whl "$CARRY/wheels"

platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 \
           manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$tag")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON" --implementation cp \
  "${platforms[@]}" -d "$CARRY/wheels" \
  "apache-tvm-ffi==$TVM_FFI_VERSION" "pyzmq==$PYZMQ_VERSION" "platformdirs==$PLATFORMDIRS_VERSION"
rm -rf "$CARRY/download"

# The default model's shape and tokenizer, from its materialized HF folder.
model_dir=$("$PY" -c "from runtime.model_loader import resolve_model_path; print(resolve_model_path(None))")
for f in config.json generation_config.json tokenizer.json tokenizer_config.json special_tokens_map.json; do
  if [ -f "$model_dir/$f" ]; then cp "$model_dir/$f" "$CARRY/smollm2_shape/"; fi
done

du -sh "$CARRY" "$CARRY"/wheels/* "$CARRY/smollm2_shape"
tree_mb=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
carry_mb=$(du -sb "$CARRY" | cut -f1)
echo "working tree $((tree_mb / 1048576)) MiB + carry $((carry_mb / 1048576)) MiB (limit 64 MiB together)"
