#!/usr/bin/env bash
# Start N training processes on this machine, joined through jax.distributed (e.g. one per GPU, or N CPU processes).
#
#   bash scripts/launch_multihost.sh N [hydra overrides ...]
#   PORT=23456 bash scripts/launch_multihost.sh 2 system.cpu_devices_per_process=2 train.batch_size=8
#
# Process 0 coordinates on 127.0.0.1:$PORT and is the only one that prints and logs. If any process fails, the
# others are stopped and the script exits with that process's status. For several machines, see docs/scaling.md.
set -uo pipefail
cd "$(dirname "$0")/.."
source activate_env.sh

n=${1:?usage: launch_multihost.sh NUM_PROCESSES [overrides ...]}
shift
port=${PORT:-$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

pids=()
for ((i = 0; i < n; i++)); do
    python train_jax.py system.num_processes="$n" system.process_id="$i" \
        system.coordinator_address="127.0.0.1:$port" "$@" &
    pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' INT TERM

status=0
for _ in "${pids[@]}"; do
    wait -n  # the next of them to end (a list of pids would name the ones already reaped: "no such job")
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
        status=$rc
        kill "${pids[@]}" 2>/dev/null  # the others would wait forever for the failed one
    fi
done
exit "$status"
