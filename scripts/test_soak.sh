#!/usr/bin/env bash
# The soaks: the tests marked `soak` (runs of several processes that are killed and resumed, sweeps of multi-process
# runs, whole experiment scripts), which the default run (scripts/test.sh) leaves out to keep it short. CI runs both.
# Extra arguments go to pytest after `-m soak`, e.g.: bash scripts/test_soak.sh -k submitit (a -m of yours replaces it)
set -euo pipefail
exec bash "$(dirname "$0")/test.sh" -m soak "$@"
