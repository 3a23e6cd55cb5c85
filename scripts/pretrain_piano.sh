#!/usr/bin/env bash
# Stage 1 of the piano pipeline: next-token pretraining on the score corpus that ships with music21 (offline), then
# a continuation of a held-out piece written as a .mid. Extra arguments are Hydra overrides.
#   bash scripts/pretrain_piano.sh [train.max_steps=...]      -> runs/piano-pretrain-<time>/
set -euo pipefail
cd "$(dirname "$0")/.."
source activate_env.sh

run_dir="runs/piano-pretrain-$(date +%Y%m%d-%H%M%S)"
t0=$SECONDS
python train_jax.py dataset=music21 model=gpt2-micro data.notes_per_record=64 \
    stage=next_token_pretraining init_from=scratch_next_token loss_masking=pretraining \
    dataset.augmentation.max_pitch_shift=5 "dataset.augmentation.speed_change_factors=[0.9,1.1]" \
    train.batch_size=16 train.max_steps=240 train.eval_interval=120 train.eval_iters=4 \
    optimizer.lr_config.lr=3e-3 optimizer.lr_config.warmup=20 \
    train.max_training_hours=0.12 logging.run_dir="$run_dir" "$@"
echo "pretraining took $((SECONDS - t0)) s; run directory: $run_dir"

python -m scripts.tools.sample "$run_dir" --which best --prompt-notes 32 --max-new-tokens 300 --temperature 0.9 --top-k 20
