"""What a run tells: the log sinks (console, metrics.jsonl, TensorBoard, wandb), the run's summary, comparisons across
runs, and FLOPs / MFU. Imports config/ and checkpoints/."""
