#!/usr/bin/env bash
# Stage 2 of the piano pipeline: fine-tune a pretrained checkpoint on a piano task (loss only after <GENAI>), evaluate
# the pretrained weights on the same task first (step 0), then answer the task for a held-out piece as a .mid.
#   bash scripts/finetune_piano.sh [PRETRAIN_RUN_DIR] [overrides...]   (default: the newest runs/piano-pretrain-*)
#   TASK=continuation bash scripts/finetune_piano.sh                    (dynamics | continuation | lower_voices)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -gt 0 ] && [ -d "$1" ]; then
    pretrained="$1"; shift
elif [ $# -gt 0 ] && [[ "$1" != *=* && "$1" != -* && ( "$1" == */* || "$1" != "~"* ) ]]; then  # a path (not key=value, ~key, a flag)
    echo "error: PRETRAIN_RUN_DIR $1: no such directory; pass a run of bash scripts/pretrain_piano.sh" >&2
    exit 1
else
    pretrained="$(ls -td runs/piano-pretrain-* 2>/dev/null | head -1 || true)"
fi
if [ -z "$pretrained" ]; then
    echo "error: no pretrained run found; run bash scripts/pretrain_piano.sh first, or pass its run directory" >&2
    exit 1
fi
task="${TASK:-dynamics}"
source activate_env.sh
run_dir="runs/piano-${task}-$(date +%Y%m%d-%H%M%S)"
t0=$SECONDS
python train_jax.py dataset=music21 model=gpt2-micro data.notes_per_record=64 \
    stage=piano_task init_from="$pretrained" checkpoint.load_file=best loss_masking=finetuning "tasks=[$task]" \
    train.eval_at_start=true train.batch_size=16 train.max_steps=100 train.eval_interval=50 train.eval_iters=4 \
    optimizer.lr_config.lr=1e-3 optimizer.lr_config.warmup=10 \
    train.max_training_hours=0.06 logging.run_dir="$run_dir" "$@"
echo "fine-tuning took $((SECONDS - t0)) s; run directory: $run_dir"

python -m scripts.tools.sample "$run_dir" --which best --task "$task" --prompt-notes 64 --max-new-tokens 300 \
    --temperature 0.7 --top-k 20
