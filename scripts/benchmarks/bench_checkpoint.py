"""How long the training loop stalls per asynchronous checkpoint save, and how long the save takes to commit.

    python -m scripts.benchmarks.bench_checkpoint [--saves 5] [--vocab 50257] [hydra overrides, e.g. model=gpt2]

The state is a real TrainState (model + AdamW moments) of the configured model with `--vocab` ids; no data is read.
`stall` is the time `Checkpointer.save` blocks the loop (finiteness check + copying the arrays off the devices);
`commit` is the time until the checkpoint is complete on disk (written in the background while training goes on).
"""

from __future__ import annotations

import argparse
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

from models.gpt import count_params
from training import config as config_lib
from training.checkpoints.checkpointer import Checkpointer
from training.distributed.sharding import init_mesh
from training.pipeline.build import init_model, init_optimizer, init_scheduler
from training.step.state import place_state


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=50257)
    args, overrides = parser.parse_known_args(argv)
    cfg = config_lib.load_config(overrides)
    mesh = init_mesh(cfg.system.num_devices)
    model = init_model(cfg, args.vocab, jax.random.PRNGKey(0), mesh)
    optimizer = init_optimizer(cfg, init_scheduler(cfg), model)
    state, _ = place_state(model, optimizer, jax.random.PRNGKey(1), mesh, cfg.system.sharding)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(eqx.filter(state, eqx.is_array)))
    directory = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    stalls, commits = [], []
    try:
        checkpointer = Checkpointer(directory, max_to_keep=2)
        for i in range(args.saves):
            state = eqx.tree_at(lambda s: s.step, state, jnp.asarray(i + 1, jnp.int32))
            jax.block_until_ready(state)
            t0 = time.perf_counter()
            checkpointer.save(state, {"step": i + 1}, val_loss=float(i))
            t1 = time.perf_counter()
            checkpointer.wait()
            t2 = time.perf_counter()
            stalls.append(t1 - t0)
            commits.append(t2 - t0)
        checkpointer.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(
        json.dumps(
            {
                "model": cfg.model.name,
                "params": count_params(state.model),
                "state_bytes": state_bytes,
                "saves": args.saves,
                "stall_ms_median": round(1000 * statistics.median(stalls), 1),
                "stall_ms_max": round(1000 * max(stalls), 1),
                "commit_s_median": round(statistics.median(commits), 2),
                "device_kind": jax.devices()[0].device_kind,
                "num_devices": len(mesh.devices.flat),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
