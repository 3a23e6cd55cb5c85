"""What logging every step costs the whole loop: train_jax.py runs at several log intervals, one JSON line each.

    python -m scripts.benchmarks.bench_loop --log-intervals 1,100 --steps 300 model=gpt2-tiny dataset.tokenizer=byte
    python -m scripts.benchmarks.bench_loop --processes 2 --log-intervals 1,100 --steps 300 model=gpt2-tiny ...

Each run is a real `train_jax.py` (in a subprocess; with --processes N, N processes joined through jax.distributed
on 127.0.0.1, each with --devices-per-process CPU devices) with no evaluation before the end and no checkpoints.
Reported per run: the median ms/step and tokens/s over the run's log intervals (from its summary.json; an interval's
time includes the metrics fetch that ends it), and the wall time of the whole command. Runs alternate between the
intervals `--repeats` times, so a drift of the shared machine touches every setting alike.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from training.config import layout

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(overrides: list[str], log_interval: int, steps: int, processes: int, devices: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        args = [
            *overrides,
            f"train.max_steps={steps}",
            f"train.log_interval={log_interval}",
            f"train.eval_interval={steps}",
            "train.eval_iters=1",
            "checkpoint.save=false",
            "logging.wandb=disabled",
            "logging.tensorboard=false",
            "logging.progress=lines",
            f"logging.run_dir={run_dir}",
        ]
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        if processes > 1:
            port = free_port()
            args += [
                f"system.num_processes={processes}",
                f"system.coordinator_address=127.0.0.1:{port}",
                f"system.cpu_devices_per_process={devices}",
            ]
        started = time.perf_counter()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "train_jax.py"),
                    *args,
                    *([f"system.process_id={i}"] if processes > 1 else []),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            for i in range(processes)
        ]
        outputs = [p.communicate() for p in procs]
        wall = time.perf_counter() - started
        for p, (_, err) in zip(procs, outputs):
            if p.returncode != 0:
                raise SystemExit(f"a run failed (exit {p.returncode}): {err.strip().splitlines()[-1:]}")
        summary = json.loads((run_dir / layout.SUMMARY).read_text())
        rows = [json.loads(line) for line in (run_dir / layout.METRICS).read_text().splitlines()]
        ms = [
            r["ms_per_step"]
            for r in rows
            if r["split"] == "train"
            and isinstance(r.get("ms_per_step"), float)
            and r["ms_per_step"] == r["ms_per_step"]
        ]
        return {
            "log_interval": log_interval,
            "processes": processes,
            "steps": steps,
            "ms_per_step_median": round(statistics.median(ms), 2),
            "tokens_per_s_median": round(summary["tokens_per_s_median"], 1),
            "wall_s": round(wall, 1),
        }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-intervals", default="1,100")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--devices-per-process", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    args, overrides = parser.parse_known_args(argv)
    for _ in range(args.repeats):
        for interval in (int(x) for x in args.log_intervals.split(",")):
            print(
                json.dumps(one_run(overrides, interval, args.steps, args.processes, args.devices_per_process)),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
