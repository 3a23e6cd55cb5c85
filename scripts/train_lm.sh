#!/usr/bin/env bash
# Train the default GPT-2 (gpt2-mini on the Python standard library) end to end, then print what it learned.
# Extra arguments are Hydra overrides, e.g.: bash scripts/train_lm.sh train.max_steps=100 model=gpt2-tiny
set -euo pipefail
cd "$(dirname "$0")/.."

t0=$SECONDS
source activate_env.sh
echo "environment ready in $((SECONDS - t0)) s"

run_dir="runs/train_lm-$(date +%Y%m%d-%H%M%S)"
t1=$SECONDS
# The time limit is a safety net on slower machines: the run then evaluates, checkpoints and stops.
python train_jax.py logging.run_dir="$run_dir" train.max_training_hours=0.15 "$@"
echo "training took $((SECONDS - t1)) s; run directory: $run_dir"

python scripts/sample.py "$run_dir" --which best --prompt "def " --prompt "class " --prompt "import " \
    --max-new-tokens 120 --temperature 0.7 --top-k 40
