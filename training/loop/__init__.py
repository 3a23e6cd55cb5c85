"""The loop: steps with a prefetched batch, the actions that fire every N steps (log, evaluate, save, agree to stop),
the training session that owns them, clocks, signals, the profiler, the host-transfer guard and the compilation
cache. Imports every package below it."""
