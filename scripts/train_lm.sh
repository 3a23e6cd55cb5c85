#!/usr/bin/env bash
# Train a small GPT-2 (gpt2-micro) on the Python standard library end to end, then print what it learned.
# Extra arguments are Hydra overrides, e.g.: bash scripts/train_lm.sh train.max_steps=100 model=gpt2-tiny
# log_data (trainit's switch; set it below, or pass log_data=true): true also logs the gradient / parameter / update
# norms (logging.log_callback_data); false logs no training statistics at all (every logging statistics knob off).
set -euo pipefail
cd "$(dirname "$0")/.."

log_data=false
overrides=()
for arg in "$@"; do
    case "$arg" in
        log_data=*) log_data="${arg#log_data=}" ;;
        *) overrides+=("$arg") ;;
    esac
done
case "${log_data,,}" in
    true) statistics=(logging.log_callback_data=true) ;;
    false) statistics=(logging.log_callback_data=false logging.store_last_grads=false logging.store_past_grads=false
                       logging.store_last_params=false logging.compute_last_loss=false logging.compute_last_grads=false
                       logging.running_stats_window=0) ;;
    *) echo "error: log_data: must be true or false; got '$log_data'" >&2; exit 2 ;;
esac

t0=$SECONDS
source activate_env.sh
echo "environment ready in $((SECONDS - t0)) s"

run_dir="runs/train_lm-$(date +%Y%m%d-%H%M%S)"
t1=$SECONDS
# gpt2-micro (4 layers x 256) sees ~2.4x the tokens gpt2-mini would in the same minutes on 2 CPU cores, and ends
# lower (docs/installation.md). The time limit (15 min) is a safety net: 2 cores of an AVX2-only EPYC, the slowest CPU
# measured, need ~11 min for all 320 steps (a Xeon with AVX-512 ~5.5), so the schedule ends on both; past the limit
# the run evaluates, checkpoints and stops.
python train_jax.py model=gpt2-micro train.max_steps=320 train.eval_interval=160 \
    optimizer.lr_config.lr=3e-3 optimizer.lr_config.warmup=20 \
    logging.run_dir="$run_dir" train.max_training_hours=0.25 "${statistics[@]}" ${overrides[@]+"${overrides[@]}"}
echo "training took $((SECONDS - t1)) s; run directory: $run_dir"

python -m scripts.tools.sample "$run_dir" --which best --prompt "def " --prompt "class " --prompt "import " \
    --max-new-tokens 120 --temperature 0.7 --top-k 40
