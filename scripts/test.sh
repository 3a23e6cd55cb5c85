#!/usr/bin/env bash
# The test suite, exactly as CI runs it. Extra arguments go to pytest, e.g.: bash scripts/test.sh -k resume
set -euo pipefail
cd "$(dirname "$0")/.."
source activate_env.sh
python check_env.py
# Two workers: most tests wait on subprocess start-up and compilation, which a second core overlaps.
python -m pytest -n "${PYTEST_WORKERS:-2}" "$@"
