"""Training: the machinery around the model, data and optimizer. The config schema and its one validation pass, the
train state and the pure train/eval steps, sharding over the device mesh and across processes, checkpoints (Orbax),
run planning (fresh, resume, init_from), the loop and the actions that fire every N steps (log, evaluate, save,
agree to stop), and the run's reports. It builds on data/, models/ and optimizers/ (and core/), which never import
it; train_jax.py and scripts/ stand above it."""
