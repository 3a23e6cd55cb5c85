#!/usr/bin/env bash
# GPT-2 against the modern decoders at (near) equal parameters and equal tokens on pystdlib (docs/models.md):
# gpt2-mini and llama-mini with AdamW, and the speedrun's modern GPT at gpt2-mini's shape with Muon, two seeds each
# (one Hydra multirun per model, in $DECODERS_OUT/<model>/, default runs/decoders); then scripts/experiments/compare_decoders.py
# writes the table and the plot (val nats/byte at the token budget and at the same training time) to docs/decoders.*.
# A model whose multirun finished (its sweep.json exists) is not run again: delete its directory to rerun it.
# Extra arguments are overrides for every run, e.g. a longer budget:
#     bash scripts/experiments/compare_decoders.sh train.max_steps=160 train.eval_interval=40
set -euo pipefail
cd "$(dirname "$0")/../.."
source activate_env.sh
OUT="${DECODERS_OUT:-runs/decoders}"

# 80 steps of 8 x 128 tokens (81,920 tokens, the CPU optimizer leaderboard's budget), evaluated every quarter.
COMMON=(dataset.context_size=128 train.batch_size=8 train.max_steps=80 train.eval_interval=20 train.eval_iters=4
        optimizer.lr_config.warmup=10 checkpoint.save=false logging.wandb=disabled logging.plot=false
        logging.tensorboard=false logging.progress=lines)
# Each optimizer at the learning rate the CPU leaderboard tuned it to (gpt2-micro, this budget), cosine to a tenth.
ADAMW=(optimizer=adamw optimizer.lr_config.lr=1e-3 optimizer.lr_config.min_lr_ratio=0.1)
MUON=(optimizer=muon optimizer.lr_config.lr=0.06 optimizer.groups.adam.lr_multiplier=0.3
      optimizer.lr_config.min_lr_ratio=0.1)
# modern-gpt's options at gpt2-mini's shape (6 layers x 384, 6 heads of 64, unrolled as the mini presets); its ReLU^2
# MLP 1216 wide instead of 4 x 384 so that the untied head's 1.6M parameters leave the total at gpt2-mini's.
MODERN_MINI=(model=modern-gpt model.n_layer=6 model.n_embd=384 model.n_head=6 model.context_size=256
             model.mlp_hidden=1216 model.scan_layers=false)

run_model() {  # name, overrides...
    local name="$1"
    shift
    if [ -f "$OUT/$name/sweep.json" ]; then
        echo "$OUT/$name: done already"
        return
    fi
    python train_jax.py -m "$@" "${COMMON[@]}" train.seed=1,2 "${EXTRA[@]}" "hydra.sweep.dir=$OUT/$name"
}

EXTRA=("$@")
run_model gpt2-mini model=gpt2-mini "${ADAMW[@]}"
run_model llama-mini model=llama-mini "${ADAMW[@]}"
run_model modern-gpt-muon "${MODERN_MINI[@]}" "${MUON[@]}"
python -m scripts.experiments.compare_decoders "$OUT" --docs
