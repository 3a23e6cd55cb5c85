#!/usr/bin/env bash
# The test suite as CI runs it first, all but the soaks (scripts/test_soak.sh, which CI runs after it). Extra arguments
# go to pytest, e.g.: bash scripts/test.sh -k resume (the soaks too: bash scripts/test.sh -m "" -k resume)
set -euo pipefail
cd "$(dirname "$0")/.."
source activate_env.sh test  # training's packages + requirements-test.txt (torch, transformers, pytest, ...)
python check_env.py --test
# Lint first: a style or import error fails in seconds, before the tests' minutes.
ruff check .
ruff format --check .
# Two workers: most tests wait on subprocess start-up and compilation, which a second core overlaps. The soaks (tests
# marked `soak`: runs of several processes, whole experiment scripts) are scripts/test_soak.sh's; a `-m` given here
# replaces this one (`bash scripts/test.sh -m ""` runs every test).
python -m pytest -n "${PYTEST_WORKERS:-2}" -m "not soak" "$@"
