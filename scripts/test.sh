#!/usr/bin/env bash
# The test suite, exactly as CI runs it. Extra arguments go to pytest, e.g.: bash scripts/test.sh -k resume
set -euo pipefail
cd "$(dirname "$0")/.."
source activate_env.sh test  # training's packages + requirements-test.txt (torch, transformers, pytest, ...)
python check_env.py --test
# Two workers, one per core (the suite keeps both busy); a module marked xdist_group runs whole on one worker, so
# that a run its tests share (a module fixture) trains once, not once per worker.
python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup "$@"
