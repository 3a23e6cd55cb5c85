"""Training: the machinery around the model, data and optimizer, one sub-package per concern (docs/ARCHITECTURE.md):

    config/        the typed config schema and its one validation pass
    distributed/   the device mesh, shardings, processes
    step/          what runs under jit: the train state, losses, train and eval steps, precision, statistics
    evaluation/    validation splits, lm-eval's adapter
    analysis/      curvature, loss landscapes, μP's coordinate check
    checkpoints/   Orbax saves and restores, run planning (fresh, resume, init_from), the save-path lock
    reporting/     the log sinks, summaries, comparisons, MFU
    pipeline/      the init_* functions and `build`
    loop/          the loop, its actions and the training session
    cli/           the Hydra command line and sweeps

A sub-package imports only those above it in this list (tests/test_layers.py). It builds on data/, models/ and
optimizers/ (and core/), which never import it; train_jax.py and scripts/ stand above it."""
