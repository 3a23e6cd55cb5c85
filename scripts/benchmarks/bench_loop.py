"""What logging every step costs the whole loop: train_jax.py runs at several log intervals, one JSON line each.

    python -m scripts.benchmarks.bench_loop --log-intervals 1,100 --steps 300 model=gpt2-tiny dataset.tokenizer=byte
    python -m scripts.benchmarks.bench_loop --processes 2 --log-intervals 1,100 --steps 300 model=gpt2-tiny ...

Each run is a real `train_jax.py` (in a subprocess; with --processes N, N processes joined through jax.distributed
on 127.0.0.1) with no evaluation before the end and no checkpoints. Each process simulates --devices-per-process CPU
devices (system.cpu_devices_per_process; the environment's XLA_FLAGS pass on, but for their host device count).
Reported per run: the devices it ran on (its header's count), the median ms/step and tokens/s over the run's log
intervals (from its metrics and summary.json; an interval's time includes the metrics fetch that ends it), and the
wall time of the whole command. One untimed warm-up run at the first interval comes first (a note on stderr), so
that one-time costs (the token store's build, compiling into the persistent cache) fall on no timed run. Runs then
alternate between the intervals `--repeats` times, so a drift of the shared machine touches every setting alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.arguments import OneLineParser, at_least
from training.config import layout

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopError(Exception):
    """A run that failed or measured nothing: one line, exit 1."""


def intervals(text: str) -> list[int]:
    """`--log-intervals`: comma-separated steps, each at least 1, at least one of them."""
    parse = at_least(1)
    values = [parse(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"no interval in {text!r}; write steps separated by commas, e.g. 1,100")
    return values


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
            f"system.cpu_devices_per_process={devices}",
        ]
        count = "--xla_force_host_platform_device_count"  # the key sets the devices, in one process too
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(count)]
        env = {**os.environ, "XLA_FLAGS": " ".join(flags)}
        if processes > 1:
            port = free_port()
            args += [f"system.num_processes={processes}", f"system.coordinator_address=127.0.0.1:{port}"]
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
                last = (err.strip().splitlines() or ["no output"])[-1]
                raise LoopError(f"a run failed (exit {p.returncode}): {last}")
        header = re.search(r"^devices\s+(\d+) x", outputs[0][0], re.MULTILINE)
        summary = json.loads((run_dir / layout.SUMMARY).read_text())
        rows = [json.loads(line) for line in (run_dir / layout.METRICS).read_text().splitlines()]
        ms = [
            r["ms_per_step"]
            for r in rows
            if r["split"] == "train"
            and isinstance(r.get("ms_per_step"), float)
            and r["ms_per_step"] == r["ms_per_step"]
        ]
        if not ms or summary.get("tokens_per_s_median") is None:
            raise LoopError(
                f"no log interval of the run at log interval {log_interval} had a rate ({steps} steps); "
                "raise --steps above the log interval"
            )
        return {
            "log_interval": log_interval,
            "processes": processes,
            "devices": int(header.group(1)) if header else None,
            "steps": steps,
            "ms_per_step_median": round(statistics.median(ms), 2),
            "tokens_per_s_median": round(summary["tokens_per_s_median"], 1),
            "wall_s": round(wall, 1),
        }


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-intervals", type=intervals, default=[1, 100], metavar="N,N,...")
    parser.add_argument("--steps", type=at_least(2), default=300, help="per run, at least 2 (the first one compiles)")
    parser.add_argument("--processes", type=at_least(1), default=1)
    parser.add_argument("--devices-per-process", type=at_least(1), default=1, help="simulated CPU devices")
    parser.add_argument("--repeats", type=at_least(1), default=1)
    args, overrides = parser.parse_known_args(argv)
    try:
        warm = args.log_intervals[0]
        print(f"bench_loop: an untimed warm-up run (log interval {warm}) first", file=sys.stderr, flush=True)
        one_run(overrides, warm, args.steps, args.processes, args.devices_per_process)
        for _ in range(args.repeats):
            for interval in args.log_intervals:
                print(
                    json.dumps(one_run(overrides, interval, args.steps, args.processes, args.devices_per_process)),
                    flush=True,
                )
    except LoopError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
