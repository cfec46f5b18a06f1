#!/usr/bin/env bash
# Run THERE (the GPU machine: PyTorch, Triton and nvcc, no FlashInfer, no package registry),
# from the repository root, with .gpu_carry/ carried from scripts/gpu/fetch_deps.sh.
# Source it (". scripts/gpu/install_deps.sh"): it exports PYTHONPATH.
#   - the carried wheels go to a private folder put first on PYTHONPATH (the system
#     environment is left alone);
#   - the repository is installed with --no-deps (its other dependencies are already
#     there); if the editable install is refused, the checkout itself is put on PYTHONPATH.
PY=${PY:-python3}
SITE=${FORKSERVE_GPU_SITE:-/tmp/forkserve-site}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu_carry/wheels/*.whl \
  || { echo "installing the carried wheels failed"; return 1 2>/dev/null || exit 1; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . ; then
  echo "editable install of the repository refused; using the checkout on PYTHONPATH"
fi
export PYTHONPATH="$PWD:$PYTHONPATH"
"$PY" - <<'PYEOF'
import importlib
for name in ("flashinfer", "tvm_ffi", "zmq", "platformdirs", "triton", "transformers", "runtime", "kernels"):
    try:
        module = importlib.import_module(name)
        print(f"  {name:13s} {getattr(module, '__version__', '')} {getattr(module, '__file__', '')}")
    except Exception as exc:  # report every missing piece, not only the first
        print(f"  {name:13s} NOT IMPORTABLE: {type(exc).__name__}: {exc}")
PYEOF
