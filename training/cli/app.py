"""The command line: train_jax.py as a Hydra application, with the project's one-line errors and exit codes.

execute(app, argv)   argv through Hydra (one run, a `-m` sweep, --help, --cfg, -sc), and its exit code. What Hydra
                     cannot compose (an override that does not parse, an unknown key or option, a wrong type) is one
                     line and exit 2, before anything runs, also for every job of a sweep. A sweep ends with its
                     summary (training/cli/sweep.py) and exits 1 when any job failed.
job(composed, main)  inside Hydra, once per job: the composed config, finished (training/config/), goes to
                     `main`, whose final `val` loss is the job's return value (what sweepers minimise). In a single
                     run an expected failure is one line and its exit code; in a sweep it is one line naming the
                     job, the job's record says so, and only that job fails.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from core import signals as stop_signals
from core.errors import CheckpointError, ConfigError, PipelineError, first_line, say
from training import config as config_lib
from training.checkpoints.storage import storage_error
from training.cli import sweep
from training.cli.overrides import as_overrides
from training.config import help as config_help  # noqa: F401  (registers the resolver that --help's template uses)
from training.distributed.peers import abandon, lost_peer

ROOT = Path(__file__).resolve().parents[2]
CFG_CHOICES = ("job", "hydra", "all")
EXCLUDE_KEYS = "hydra.job.config.override_dirname.exclude_keys"
Main = Callable[[config_lib.Config, list[str], float], float | None]  # train_jax.main: the final val loss


def hydra_argv(argv: list[str]) -> list[str]:
    """`--cfg` alone, followed by overrides, means Hydra's `--cfg job --resolve`: the task's config, every value
    resolved (Hydra's `--cfg` wants one of job, hydra, all next)."""
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg in ("--cfg", "-c") and (i + 1 == len(argv) or argv[i + 1] not in CFG_CHOICES):
            out += ["job", "--resolve"]
    return out


def _parsed(argv: list[str]) -> argparse.Namespace | None:
    from hydra._internal.utils import get_args_parser  # the parser hydra.main itself uses

    try:
        # argparse prints its usage before it exits, and --version its version: Hydra's own call prints them
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return get_args_parser().parse_args(argv)
    except SystemExit:  # Hydra's own call says what is wrong, once
        return None


def _overrides(argv: list[str]) -> list[str]:
    return args.overrides if (args := _parsed(argv)) is not None else []


def name_jobs_by_what_varies(argv: list[str]) -> list[str]:
    """A sweep's job directories are named by Hydra's override_dirname; the overrides that give every job the same
    value are left out of it (hydra.job.config.override_dirname.exclude_keys, unless the command sets that), so
    `3-optimizer.lr_config.lr=0.003,optimizer=lion` says what job 3 is."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = _parsed(argv)
    if args is None or not args.multirun or any(o.startswith(EXCLUDE_KEYS) for o in args.overrides):
        return argv
    try:
        parsed = OverridesParser.create().parse_overrides(args.overrides)
    except HydraException:
        return argv  # Hydra names the argument it cannot parse
    swept = {o.key_or_group for o in parsed if o.is_sweep_override()}
    # a key both fixed and swept (a preset's value, then a sweep over it) varies: it stays in the names
    fixed = sorted({o.key_or_group for o in parsed if not o.is_sweep_override() and not o.is_hydra_override()} - swept)
    if not fixed:
        return argv
    # beside the command's overrides: Hydra's parser takes them as one run of arguments (`a=1,2 -m` as `-m a=1,2`)
    at = argv.index(args.overrides[0])
    return [*argv[:at], f"{EXCLUDE_KEYS}=[{','.join(repr(k) for k in fixed)}]", *argv[at:]]


def execute(app: Callable[[], object], argv: list[str]) -> int:
    """Run `app` (the hydra.main-decorated task) on `argv`; the exit code."""
    argv = name_jobs_by_what_varies(hydra_argv(as_overrides(argv)))  # as_overrides: trainit's README forms too
    if problem := config_lib.null_group_choice(_overrides(argv)):  # `recipe=null`, in a run or a sweep
        return say(problem, exit_code=2)
    multirun = (args := _parsed(argv)) is not None and args.multirun
    if multirun and (sweep_dir := _given_sweep_dir(args.overrides)) is not None:
        try:  # a folder of another sweep's jobs, named on the command line: before anything runs or is written
            sweep.check_request(sweep_dir, args.overrides)
        except PipelineError as e:
            return say(e, exit_code=2)
    if multirun and (problem := sweep.segments_of_a_study(args.overrides)):
        return say(problem, exit_code=2)
    kept = ("HYDRA_FULL_ERROR", "PYTHONPATH", sweep.COMMAND_ID)
    saved_argv, saved_env = sys.argv, {k: os.environ.get(k) for k in kept}
    sys.argv = [saved_argv[0], *argv]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra's errors reach this function as exceptions, not printed tracebacks
    # Launchers that run jobs in fresh processes (submitit) unpickle the task, which names this checkout's modules.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [saved_env["PYTHONPATH"]])])
    sweep.started.clear()
    command = os.environ[sweep.COMMAND_ID] = uuid.uuid4().hex  # what its jobs' notes name, in any process
    stop_signals.pending.clear()
    code = 0
    # SIGTERM as Ctrl-C for a sweep (a scheduler's stop): between jobs and while one starts, before its loop takes
    # the signal itself (training/loop/signals.py), it killed the process with no summary (exit 143)
    handlers = {}
    if multirun and threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, _stop_the_sweep) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        app()
    except SystemExit as e:  # a single run's expected failure (already said), --help, or a usage error
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except sweep.JobFailed:
        code = 1  # the job said why, and the summary below lists it
    except KeyboardInterrupt:
        if not multirun:
            raise
        where = sweep.started[-1] if sweep.started else "<the sweep's directory>"
        code = say(
            PipelineError(
                f"sweep: stopped by a signal; the same command with hydra.sweep.dir={where} "
                "checkpoint.load=auto continues it"
            )
        )
    except (HydraException, OmegaConfBaseException) as e:
        code = say(config_lib.composition_error(e, _overrides(argv)))
    except Exception as e:
        # Only the sweep's machinery raises anything else here (a job's own failure is a JobFailed): a launcher
        # that finds no cluster, a submission refused, a search space Optuna rejects. HYDRA_FULL_ERROR=1: traceback.
        if saved_env["HYDRA_FULL_ERROR"] == "1":
            raise
        if not multirun:
            if not (isinstance(e, ValueError) and _raised_by_hydra(e)):
                raise
            # Hydra's own flags misused (two of --cfg/--info/-sc, an unknown -sc command, a missing rerun file)
            code = say(PipelineError(first_line(e, 300)), exit_code=2)
        else:
            code = say(PipelineError(f"sweep: {type(e).__name__}: {first_line(e, 300)}{_raised_within(e)}"))
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        stop_signals.pending.clear()  # a later run in this process (a notebook's, a test's) owes it nothing
        sys.argv = saved_argv
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for sweep_dir in sweep.started:
            code = _report_sweep(sweep_dir, code, command) or code
    return code


def _stop_the_sweep(signum: int, frame: object) -> None:
    """SIGTERM or SIGINT to a sweep outside a run's loop (which takes them itself): raised as Ctrl-C is, and noted,
    so that a job whose set-up turns the KeyboardInterrupt into another error (datasets' file lookup: a
    FileNotFoundError) stops the sweep instead of failing as a bug while the next job starts, and a job that lost it
    (a finalizer's "Exception ignored") stops after its loop's first step (core/signals.py)."""
    stop_signals.pending.append(signal.Signals(signum).name)
    raise KeyboardInterrupt


def _report_sweep(sweep_dir: Path, code: int, command: str) -> int:
    """Write the sweep's summary and say where it is; 1 when any job did not complete or was refused at the door by
    this `command` (its COMMAND_ID), 2 for a sweep of no job (`code`: the exit code so far). In a sweep of
    several processes (each job one multi-process run), process 0 alone: the others' summary read the jobs' records
    before process 0 had written the last one's end, and failed.
    """
    import jax

    if jax.distributed.is_initialized() and jax.process_index() != 0:
        return code
    if not sweep.read_records(sweep_dir):
        if code:  # no job ran: Hydra refused the sweep's config before starting any, and said why
            return code
        return say(PipelineError(f"sweep {sweep_dir}: the sweep has no job (a value list or range is empty)"), "", 2)
    summary = sweep.summarize_sweep(sweep_dir)
    paused = (
        f", {summary['paused']} paused after their checkpoint.num_steps segment (the same command with "
        "checkpoint.load=auto continues them)"
        if summary["paused"]
        else ""
    )
    print(
        f"sweep: {summary['completed']} of {len(summary['jobs'])} jobs completed{paused}; summary in "
        f"{sweep_dir / 'sweep.md'} (and sweep.json)",
        flush=True,
    )
    if refused := sweep.refused_jobs(sweep_dir, command):  # their records say how they ended before; none ran now
        print(
            f"error: sweep {sweep_dir}: job {', '.join(refused)} refused (their runs are there already): "
            "checkpoint.load=auto continues them",
            file=sys.stderr,
            flush=True,
        )
        return 1
    if not summary["failed"]:
        return 0
    numbers = ", ".join(str(j["job"]) for j in summary["jobs"] if j["status"] not in (sweep.COMPLETED, sweep.PAUSED))
    print(
        f"error: sweep {sweep_dir}: {summary['failed']} of {len(summary['jobs'])} jobs failed or did not finish "
        f"(job {numbers}); {sweep_dir / 'sweep.md'} says why",
        file=sys.stderr,
        flush=True,
    )
    return 1


def expected_failure(e: Exception) -> PipelineError | None:
    """The one-line error an exception stands for, or None for a bug (which keeps its traceback). A lost process of
    a multi-process run ends this process here, with its line."""
    if isinstance(e, PipelineError):
        return e
    if isinstance(e, OSError) and (error := storage_error(e)) is not None:
        return error
    if (lost := lost_peer(e)) is not None:
        abandon(lost)
    return None


def job(composed: DictConfig, main: Main) -> float | None:
    """One Hydra job: `main(config, overrides, started)` on the finished config; returns what main returns."""
    started = time.time()
    hydra = HydraConfig.get()
    overrides = list(hydra.overrides.task)
    if hydra.mode != RunMode.MULTIRUN:
        try:
            return main(config_lib.finish(composed), overrides, started)
        except Exception as e:
            if (error := expected_failure(e)) is None:
                raise
            raise SystemExit(say(error)) from None  # passes through Hydra, which only catches Exception
    return _sweep_job(composed, main, hydra, overrides, started)


def _sweep_job(
    composed: DictConfig, main: Main, hydra: DictConfig, overrides: list[str], started: float
) -> float | None:
    """A job of a sweep: its run directory is Hydra's job directory (unless logging.run_dir is set), and job.json
    there says how it went; a failure is one line naming the job, and fails this job only."""
    job_dir = Path(hydra.runtime.output_dir)
    if OmegaConf.select(composed, "logging.run_dir") is None:
        with open_dict(composed):
            composed.logging.run_dir = str(job_dir)
    record = {
        "job": hydra.job.num,
        "overrides": overrides,
        "run_dir": str(Path(composed.logging.run_dir).expanduser().absolute()),
        "status": sweep.RUNNING,
    }
    earlier = sweep.read_record(job_dir)  # a job this sweep ran before (its command run again)
    continuing = str(OmegaConf.select(composed, "checkpoint.load", default="")).lower() == "auto"
    if continuing and earlier is not None and earlier.get("status") == sweep.COMPLETED:
        # a stopped sweep continued: a job that completed is read as it ended, whether or not its run kept a
        # checkpoint to resume at its end (checkpoint.save=false, as the experiments' sweeps run: it trained again)
        print(f"sweep job {hydra.job.num}: completed before, val {earlier.get('val_loss')}: not run again", flush=True)
        return earlier.get("val_loss")
    sweep.write_record(job_dir, record)
    stopped_record = lambda name: {**record, "status": sweep.STOPPED, "stopped": name}  # noqa: E731
    try:
        value = main(config_lib.finish(composed), overrides, started)
    except KeyboardInterrupt:  # a signal before the run's loop took over: the sweep stops (app.execute says so)
        sweep.write_record(job_dir, stopped_record(stop_signals.pending[-1] if stop_signals.pending else "SIGINT"))
        raise
    except Exception as e:
        if stop_signals.pending:  # the signal, turned into another error on its way out: a stop, not this job's failure
            sweep.write_record(job_dir, stopped_record(stop_signals.pending[-1]))
            raise KeyboardInterrupt from None
        error = expected_failure(e)
        if error is None:
            traceback.print_exc()
        reason = str(error) if error is not None else f"{first_line(e, 300)} ({type(e).__name__}: a bug)"
        line = f"sweep job {hydra.job.num} ({hydra.job.override_dirname or 'no overrides'}): {reason}"
        print(f"error: {line}", file=sys.stderr, flush=True)
        if earlier is not None and isinstance(error, (ConfigError, CheckpointError)):
            # refused at the door (its run directory holds that run): nothing ran, so the record of the job that
            # did stays as it was
            sweep.write_record(job_dir, earlier)
            sweep.refuse_job(job_dir, f"{hydra.job.num} ({hydra.job.override_dirname or 'no overrides'})")
        else:
            failed = {**record, "status": sweep.FAILED, "error": reason, "wall_s": round(time.time() - started, 1)}
            sweep.write_record(job_dir, failed)
        raise sweep.JobFailed(line) from None
    import jax

    stopped = sweep.stop_reason(Path(record["run_dir"]))
    signalled = stopped not in (None, "max_steps", "time limit", "checkpoint.num_steps")  # the last two: as asked
    paused = stopped == "checkpoint.num_steps"  # a segment that ended before train.max_steps: not a final loss
    if jax.process_index() == 0:
        sweep.write_record(
            job_dir,
            {
                **record,
                "status": sweep.STOPPED if signalled else sweep.PAUSED if paused else sweep.COMPLETED,
                "val_loss": value,
                "stopped": stopped,
                "wall_s": round(time.time() - started, 1),
            },
        )
    if (signalled or stop_signals.pending) and sweep.started:
        raise KeyboardInterrupt  # the jobs run in this process, which was asked to stop: the sweep stops
    if signalled:  # its loss is not a finished run's: the job fails, and resumes when the sweep is rerun
        line = f"sweep job {hydra.job.num} ({hydra.job.override_dirname or 'no overrides'}): stopped by {stopped}"
        print(f"error: {line}", file=sys.stderr, flush=True)
        raise sweep.JobFailed(line)
    return value


def _given_sweep_dir(overrides: list[str]) -> Path | None:
    """The sweep folder the command names (its last `hydra.sweep.dir=`), None where Hydra's default names a new one
    or the value is an interpolation that only Hydra resolves."""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.dir=")]
    return Path(given[-1]).absolute() if given and "${" not in given[-1] else None


def _raised_by_hydra(e: BaseException) -> bool:
    """The exception comes from Hydra's own code (its innermost frame is in the hydra package)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}hydra{os.sep}" in tb.tb_frame.f_code.co_filename


def _raised_within(e: BaseException) -> str:
    """` ... <Error>: <why>` from a traceback inside a message (submitit's for a job that failed in its process)."""
    raised = [line.strip() for line in str(e).splitlines()[1:] if re.match(r"[\w.]+(Error|Exception)\b", line)]
    return f" ... {raised[-1][:300]}" if raised else ""
