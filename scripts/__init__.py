"""The project's commands beyond training, each run from the checkout as `python -m scripts.<group>.<name> --help`:

- scripts/tools/: what a user runs on a run directory or a checkpoint: sample, eval_harness, export_hf,
  compare_runs, plot_runs, plot_geometry, profile_summary, hessian, landscape; and state_memory (a config's
  memory per device before any run).
- scripts/benchmarks/: timings and soaks, each printing one JSON line (BENCHMARKS.md has their figures).
- scripts/experiments/: the research studies behind the presets and the docs: the optimizer leaderboard, the
  schedule search, μP transfer and coordinate checks, the decoder comparison.

The shell scripts at this level are whole jobs: train_lm.sh (the default run), test.sh (the suite), the piano
stages and the multi-host launcher."""
