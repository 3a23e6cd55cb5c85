#!/usr/bin/env bash
# The optimizer leaderboard (scripts/experiments/optimizer_leaderboard.py): every optimizer at its own tuned lr and knob, at one
# token budget on pystdlib, two seeds for the finalists; the table and plot land in runs/leaderboard and docs/.
# Extra arguments go to the script, e.g. another budget in a folder of its own (a folder holds one board):
#   bash scripts/experiments/optimizer_leaderboard.sh --steps 240 --out runs/leaderboard-240
set -euo pipefail
cd "$(dirname "$0")/../.."
source activate_env.sh
python -m scripts.experiments.optimizer_leaderboard --docs "$@"
