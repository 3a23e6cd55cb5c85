#!/usr/bin/env bash
# Start N training processes on this machine, joined through jax.distributed (e.g. one per GPU, or N CPU processes).
#
#   bash scripts/launch_multihost.sh N [hydra overrides ...]
#   PORT=23456 bash scripts/launch_multihost.sh 2 system.cpu_devices_per_process=2 train.batch_size=8
#   bash scripts/launch_multihost.sh 2 -m optimizer.lr_config.lr=1e-3,3e-3   (a sweep: each job runs in all N)
#
# Process 0 coordinates on 127.0.0.1:$PORT and is the only one that prints and logs. If any process fails, the
# script says which (its process_id, pid and status) in one line, stops the others and exits with that status. For
# several machines, see docs/scaling.md.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:?usage: launch_multihost.sh NUM_PROCESSES [overrides ...]}
if [[ ! $n =~ ^[1-9][0-9]*$ ]]; then
    echo "launch_multihost.sh: NUM_PROCESSES must be a whole number >= 1; got '$n'" >&2
    exit 2
fi
shift
source activate_env.sh
port=${PORT:-$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

# A sweep (-m, wherever it was given) goes first, as Hydra's command line wants it; its folder is named once here,
# so that every process's jobs share it (each process's own clock could name another second).
args=() sweep=() job=train_jax named=
for arg in "$@"; do
    case $arg in
        -m | --multirun) sweep=(-m) ;;
        hydra.sweep.dir=*) named=1 args+=("$arg") ;;
        hydra.job.name=*) job=${arg#hydra.job.name=} args+=("$arg") ;;
        *) args+=("$arg") ;;
    esac
done
if ((${#sweep[@]})) && [[ -z $named ]]; then  # conf/config.yaml's hydra.sweep.dir, its time taken once
    sweep+=("hydra.sweep.dir=runs/sweeps/$job-$(date +%Y%m%d-%H%M%S)")
fi

pids=()
declare -A rank_of=()  # pid -> process_id
for ((i = 0; i < n; i++)); do
    # the layout after the user's arguments: these win over the same keys
    python train_jax.py "${sweep[@]}" "${args[@]}" system.num_processes="$n" system.process_id="$i" \
        system.coordinator_address="127.0.0.1:$port" &
    pids+=($!)
    rank_of[$!]=$i
done
interrupted=
trap 'interrupted=INT; kill "${pids[@]}" 2>/dev/null' INT
trap 'interrupted=TERM; kill "${pids[@]}" 2>/dev/null' TERM

# The script names the failed process: bash's own note on one killed by a signal names none ("line N: <pid> Killed
# python train_jax.py ... system.process_id="$i" ..."), so it is silenced. `wait -n -p` (bash 5.1) says which process
# ended; an older bash only says that one did.
named=$((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 501))
status=0
left=$n
while ((left > 0)); do
    ended=
    if ((named)); then
        wait -n -p ended 2>/dev/null  # the next of them to end (a list of pids would name the reaped: "no such job")
    else
        wait -n 2>/dev/null
    fi
    rc=$?
    if [ -n "$interrupted" ] && [ -z "${ended:-}" ] && ((rc > 128)); then  # the trap cut the wait short
        if [ "$status" -eq 0 ]; then
            status=$rc
            echo "launch_multihost.sh: SIG$interrupted; stopping the processes" >&2
        fi
        ((named)) && continue  # no process ended: each is still to be waited for
    fi
    left=$((left - 1))
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
        status=$rc
        how="status $rc"
        ((rc > 128)) && how="$how (SIG$(kill -l "$rc"))"
        who="a process"
        [ -n "${ended:-}" ] && who="process ${rank_of[$ended]} (pid $ended)"
        echo "launch_multihost.sh: $who of $n failed with $how; stopping the others" >&2
        kill "${pids[@]}" 2>/dev/null  # the others would wait forever for the failed one
    fi
done
exit "$status"
