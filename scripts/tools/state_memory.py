"""Per-device bytes of the train state (parameters + optimizer state) for every data x model layout, from shapes and
shardings.

    python -m scripts.tools.state_memory --devices 8 --vocab 50257 model=gpt2-xl [optimizer=adamw ...]

For each size of the mesh's `model` axis (tensor parallelism: 1, 2, 4, ... up to --devices, where it divides the
heads) and each `data` layout (dp: replicated, fsdp: sharded), the bytes the most loaded device holds. Nothing is
allocated: the state is abstract (jax.eval_shape). On a CPU machine `--devices` simulates that many host devices; on
accelerators it must not exceed the devices present.
"""

from __future__ import annotations

import json
import os
import sys

from core.arguments import OneLineParser, at_least
from core.errors import PipelineError, say

parser = OneLineParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--devices", type=at_least(1), default=8)
parser.add_argument("--vocab", type=at_least(1), default=50257)
args, overrides = parser.parse_known_args()
if flags := [o for o in overrides if o.startswith("-")]:
    parser.error(f"unrecognized arguments: {' '.join(flags)}")
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"

import equinox as eqx  # noqa: E402
import jax  # noqa: E402

from models.gpt import count_params  # noqa: E402
from training import config as config_lib  # noqa: E402
from training.distributed.sharding import init_mesh, per_device_bytes, state_shardings  # noqa: E402
from training.pipeline.build import init_model, init_optimizer, init_scheduler, state_options  # noqa: E402
from training.step.state import TrainState  # noqa: E402


def main() -> int:
    try:
        cfg = config_lib.load_config(overrides)
    except PipelineError as e:
        return say(e)
    model = eqx.filter_eval_shape(init_model, cfg, args.vocab, jax.random.PRNGKey(0))
    optimizer = init_optimizer(cfg, init_scheduler(cfg), model)
    state = eqx.filter_eval_shape(
        TrainState.create, model, optimizer, jax.random.PRNGKey(0), *state_options(cfg, model)
    )
    report = {
        "model": cfg.model.name,
        "params": count_params(model),
        "optimizer": cfg.optimizer.name,
        "grad_accum_steps": cfg.train.grad_accum_steps,
        "devices": args.devices,
        "layouts": [],
    }
    model_sizes = [
        m
        for m in range(1, args.devices + 1)
        if args.devices % m == 0 and cfg.model.n_head % m == 0 and cfg.model.vocab_multiple % m == 0
    ]
    for m in model_sizes:
        mesh = init_mesh(args.devices, m)
        row = {"data": args.devices // m, "model": m}
        for layout in ("dp", "fsdp"):
            row[f"{layout}_bytes_per_device"] = per_device_bytes(state, state_shardings(state, mesh, layout))
        report["layouts"].append(row)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
