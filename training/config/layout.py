"""A run directory's files, named once: the loop, the reporters, the checkpointer, resume, the sweep runner and the
tools in scripts/ take every name from here.

    runs/<name>/              logging.run_dir (default runs/<model>-<dataset>-<time>)
      config.yaml             the composed config (also beside the checkpoints when checkpoint.save_path is elsewhere)
      metrics.jsonl           one JSON line per logged step and per evaluation; a resumed run appends
      metrics.superseded-<time>.jsonl   the rows past the step a run resumed at, set aside (kept)
      summary.json            each split's final and best loss, tokens, throughput, how the run ended
      plots.png               loss, lr and tokens/s per step (logging.plot)
      checkpoints/<step>/     Orbax checkpoints (checkpoint.save_path, when not set)
      tensorboard/            event files (logging.tensorboard)
      profile/                traces of the profiled steps (system.profile_steps)
      eval-step<N>.json       what mode=eval measured on checkpoint N
      samples/                what scripts.tools.sample wrote
      abandoned-<time>/       the logs of a run that left no checkpoint, set aside when checkpoint.load=auto restarts
"""

from __future__ import annotations

from pathlib import Path

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
PLOTS = "plots.png"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
PROFILE = "profile"
SAMPLES = "samples"
ABANDONED = "abandoned-"  # + <time>: logs set aside, not a run of their own (compare_runs passes over them)


def eval_result(step: int) -> str:
    """The file mode=eval writes for checkpoint `step`."""
    return f"eval-step{step}.json"


def is_run_dir(path: Path | str) -> bool:
    """A directory a run has logged to (it has metrics.jsonl)."""
    return (Path(path) / METRICS).exists()
