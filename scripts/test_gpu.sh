#!/usr/bin/env bash
# The tests whose behaviour depends on the backend (`pytest -m gpu`), on this machine's GPU: bf16, float16 and FP8
# numerics (and cuBLASLt's FP8 GEMMs), cuDNN's attention against XLA's, the chunked LM head against the dense one,
# remat and scanned layers, the step's donation and its one-device mesh, exact resume, checkpoints of device arrays.
# The whole suite is `bash scripts/test.sh` and `bash scripts/test_soak.sh` (on the CPU, also on a GPU machine). Extra
# arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source activate_env.sh  # training's packages; on a machine whose nvidia-smi lists a GPU, JAX's CUDA build
python check_env.py
if ! python -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")'; then
    echo "error: JAX sees no GPU here (python check_env.py names its backend); the whole suite: bash scripts/test.sh" >&2
    exit 2
fi
# pytest and its plugins at the test command's pins, where the training environment lacks them
if ! python -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' \
        pytest xdist pytest_timeout; then
    python -m pip install --quiet --disable-pip-version-check $(grep -E '^pytest(-xdist|-timeout)?==' requirements-test.txt)
fi
# Each worker (and each process a test starts) takes GPU memory as it needs it, instead of 75% of the card at start.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# The tests that compare runs bit for bit (marked deterministic) on XLA's deterministic kernels, as
# system.deterministic=true runs (a GPU's default kernels use atomics); the others on the GPU's defaults. Exit 5 is
# pytest's "no test selected", which -k can make of either half.
status=0
python -m pytest -m "gpu and not deterministic" -n "${PYTEST_WORKERS:-4}" "$@" || { rc=$?; [ $rc -eq 5 ] || status=$rc; }
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_deterministic_ops=true" python -m pytest -m "gpu and deterministic" \
    -n "${PYTEST_WORKERS:-4}" "$@" || { rc=$?; [ $rc -eq 5 ] || status=$rc; }
exit $status
