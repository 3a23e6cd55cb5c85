"""How long the training loop stalls per asynchronous checkpoint save, and how long the save takes to commit.

    python -m scripts.benchmarks.bench_checkpoint [--saves 5] [--vocab 50257] [hydra overrides, e.g. model=gpt2]

The state is a real TrainState (model + AdamW moments) of the configured model with `--vocab` ids, on the run's mesh
(system.mesh_model included) and with its precision and statistics, made by training/pipeline/build.py's own
functions; no data is read. `stall` is the time `Checkpointer.save` blocks the loop (finiteness check + copying the
arrays off the devices); `commit` is the time until the checkpoint is complete on disk (written in the background
while training goes on). One untimed save comes first, reported apart as `first_save` (it compiles the finiteness
check); `--saves` timed saves follow.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

from core.arguments import OneLineParser, at_least
from core.errors import PipelineError, say
from models.gpt import count_params
from training import config as config_lib
from training.checkpoints.checkpointer import Checkpointer
from training.distributed.sharding import init_mesh
from training.pipeline.build import init_model, init_optimizer, init_scheduler, init_state_and_steps
from training.step.state import TrainState


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saves", type=at_least(1), default=5, help="timed saves, after one untimed first save")
    parser.add_argument("--vocab", type=at_least(1), default=50257)
    args, overrides = parser.parse_known_args(argv)
    try:
        cfg = config_lib.load_config(overrides, jax.local_device_count())
        mesh = init_mesh(cfg.system.num_devices, cfg.system.mesh_model)  # as training/pipeline/build.py's `build`
        model = init_model(cfg, args.vocab, jax.random.PRNGKey(0), mesh)
        schedule = init_scheduler(cfg)
        optimizer = init_optimizer(cfg, schedule, model)
        state, _, _, _ = init_state_and_steps(cfg, model, schedule, optimizer, jax.random.PRNGKey(1), mesh)
        state_bytes = sum(x.nbytes for x in jax.tree.leaves(eqx.filter(state, eqx.is_array)))
        first, timed = time_saves(state, args.saves + 1)
    except PipelineError as e:
        return say(e)
    stalls, commits = [s for s, _ in timed], [c for _, c in timed]
    print(
        json.dumps(
            {
                "model": cfg.model.name,
                "params": count_params(state.model),
                "state_bytes": state_bytes,
                "first_save": {"stall_ms": round(1000 * first[0], 1), "commit_s": round(first[1], 2)},
                "saves": args.saves,
                "stall_ms_median": round(1000 * statistics.median(stalls), 1),
                "stall_ms_max": round(1000 * max(stalls), 1),
                "commit_s_median": round(statistics.median(commits), 2),
                "device_kind": jax.devices()[0].device_kind,
                "num_devices": len(mesh.devices.flat),
                "mesh": dict(mesh.shape),
            }
        )
    )
    return 0


def time_saves(state: TrainState, saves: int) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """(stall, commit) seconds of the first of `saves` saves to a temporary folder, and of each later one."""
    directory = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    times = []
    try:
        checkpointer = Checkpointer(directory, max_to_keep=2)
        for i in range(saves):
            state = eqx.tree_at(lambda s: s.step, state, jnp.asarray(i + 1, jnp.int32))
            jax.block_until_ready(state)
            t0 = time.perf_counter()
            checkpointer.save(state, {"step": i + 1}, val_loss=float(i))
            t1 = time.perf_counter()
            checkpointer.wait()
            times.append((t1 - t0, time.perf_counter() - t0))
        checkpointer.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return times[0], times[1:]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
