"""A sweep (`python train_jax.py -m ...`): the name of each job's directory, what each job records there, and the
summary written when the sweep ends, however it ends.

Layout (conf/hydra/output/runs.yaml):
  runs/sweeps/<hydra.job.name>-<time>/
    <num>-<overrides>/          one job, and its run directory (metrics.jsonl, config.yaml, summary.json,
                                checkpoints/) unless logging.run_dir says otherwise; job.json: the job's number,
                                overrides, status, final `val` loss, run directory and, when it failed, why;
                                job.refused: the command that refused to run it again into its finished run
    sweep.json, sweep.md        every job's status, final `val` loss and the overrides that tell it from the others,
                                the best job, and the comparison of training/compare.py (what differs between the
                                runs, every split's final and best loss), also as comparison.md/.csv/.png
    multirun.yaml               Hydra's basic sweeper: the sweep's config
    sweep_request.json          the overrides the sweep started with: another sweep into this folder is refused
    sweep_plan.json             every job's overrides, where the sweeper knows them at its start (the basic one)
    optimization_results.yaml   the Optuna sweeper: its best parameters and value
    .submitit/                  the submitit launchers: each job's script, pickles and logs
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.errors import ConfigError, PipelineError
from core.files import write_atomic
from training.config import layout
from training.reporting.compare import markdown, write_comparison
from training.reporting.summary import finite_number

JOB_RECORD = "job.json"
REQUEST = "sweep_request.json"  # the overrides the folder's sweep was started with (job directories aside)
PLAN = "sweep_plan.json"  # every job's overrides, where the sweeper knows them at its start (planned_jobs)
DIRNAME_MAX = 160  # characters of a job directory's name (file systems allow 255 bytes per name)
COMPLETED, FAILED, RUNNING, STOPPED = "completed", "failed", "running", "stopped"
NOT_STARTED = "not started"  # a planned job of a sweep stopped before it (no record of its own)
# A job whose run ended its checkpoint.num_steps segment before train.max_steps: as asked, not finished (its loss is
# not a final one); the same command with checkpoint.load=auto continues it
PAUSED = "paused"

# Sweep directories this process started (noted by SweepSummary), for training/cli/app.py to summarise at the end.
started: list[Path] = []
REFUSED = "job.refused"  # beside job.json: this job refused at the door, its earlier record kept (refuse_job)


class JobFailed(Exception):
    """A sweep job that failed: its line was printed and recorded; Hydra marks the job failed, the others run."""


class SweepSummary(Callback):
    """Hydra calls it in the process that runs the sweep, whatever the launcher: it notes the sweep directory. The
    summary is written after Hydra returns, because a failed job ends Hydra's sweep with an exception, and no
    `on_multirun_end` is called then."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        started.append(sweep_dir)
        # the sweep's overrides, which check_request compares a later one's to (a sweep that ran no job leaves
        # nothing to protect: a corrected command replaces its request)
        if not (sweep_dir / REQUEST).exists() or not holds_jobs(sweep_dir):
            write_atomic_in(sweep_dir, REQUEST, json.dumps(list(config.hydra.overrides.task)))
        if (planned := planned_jobs(config)) is not None:
            write_atomic_in(sweep_dir, PLAN, json.dumps(planned))
        else:  # a sweeper that chooses as it goes: an earlier sweep's plan is not this one's
            (sweep_dir / PLAN).unlink(missing_ok=True)


def planned_jobs(config: DictConfig) -> list[list[str]] | None:
    """Every job's overrides, in job order, where the sweeper knows them before it starts (Hydra's basic sweeper:
    the product of the swept values, as it splits them); None for a sweeper that chooses as it goes (Optuna)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if OmegaConf.select(config, "hydra.sweeper._target_") != f"{BasicSweeper.__module__}.{BasicSweeper.__name__}":
        return None
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(arguments), None)
    return [list(job) for batch in batches for job in batch]


def holds_jobs(sweep_dir: Path) -> bool:
    """A job of the folder's sweep has run there (its job.json), or the sweep was summarised."""
    return (sweep_dir / "sweep.json").exists() or bool(read_records(sweep_dir))


# Overrides that do not change which jobs a sweep runs: Hydra's own settings (its sweep folder, launcher, logging),
# how the jobs start from their checkpoints (checkpoint.load=auto continues a stopped sweep) and where they run
# (system.*: each process of launch_multihost.sh has its own system.process_id). The sweeper and its settings do
# choose the jobs (an Optuna study's search space, sampler and seed), except how many trials it asks in all and at
# once (more trials extend a study).
_NOT_THE_JOBS = re.compile(r"^[+~]*(hydra[./](?!sweeper\b)|hydra\.sweeper\.n_(trials|jobs)=|checkpoint\.|system\.)")


def same_sweep(asked: list[str], overrides: list[str]) -> bool:
    """Whether two sweeps' overrides ask for the same jobs: in any order, the settings of _NOT_THE_JOBS aside."""

    def jobs(given: list[str]) -> list[str]:
        return sorted(o for o in given if not _NOT_THE_JOBS.match(o))

    return jobs(asked) == jobs(overrides)


def check_request(sweep_dir: Path, overrides: list[str], what: str = "hydra.sweep.dir") -> None:
    """A folder that holds another sweep's jobs is refused: a summary would read them as this sweep's, and the jobs
    of the same directory names would find that sweep's runs there. The same sweep again (its command, with
    checkpoint.load=auto say) is taken: it continues."""
    request = Path(sweep_dir) / REQUEST
    asked = json.loads(request.read_text()) if request.exists() else None
    if asked is not None and not same_sweep(asked, overrides) and holds_jobs(Path(sweep_dir)):
        raise PipelineError(
            f"{what}: {sweep_dir} holds another sweep's jobs ({' '.join(asked) or 'no overrides'}); give this one "
            "another output folder, or remove that one to run it again"
        )


def segments_of_a_study(overrides: list[str]) -> ConfigError | None:
    """checkpoint.num_steps under an Optuna sweeper: the study would take each segment's val loss as its trial's
    final value (and a later command's study asks new trials instead of continuing those). None where the command
    asks for no segments or another sweeper."""
    segments = [o for o in overrides if re.match(r"^\+*checkpoint\.num_steps=(?!null$)", o)]
    chosen = [o for o in overrides if re.match(r"^\+*hydra/sweeper=", o)]
    if not segments or not chosen:
        return None
    from training.config.compose import hydra_settings

    try:
        hydra = hydra_settings(chosen[-1:])
    except (HydraException, OmegaConfBaseException):  # a sweeper that does not exist: Hydra's own run says so
        return None
    if "optuna" not in str(OmegaConf.select(hydra, "sweeper._target_", default="")).lower():
        return None
    return ConfigError(
        f"config: {segments[-1]}: an Optuna study takes each job's val loss as its trial's final value, and a "
        "segment's is not final (nor does a later study continue the trial): run the study's jobs whole"
    )


def write_atomic_in(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / name, text)


def job_dirname(num: int, overrides: str | None) -> str:
    """`<num>-<overrides>` (Hydra's override_dirname: `optimizer.lr_config.lr=0.001,optimizer=lion`) as one directory
    name: a `/` (of `optimizer/lr_config=linear` or a path) or a space becomes `_`, and a long one is cut; the number
    keeps it unique; a list's brackets become parentheses."""
    name = f"{num}-{overrides}" if overrides else str(num)
    # a list value's brackets become parentheses: TensorStore reads a path holding `[...]` as a pattern, so a job's
    # checkpoints there would save but never restore (training/checkpoints/storage.py)
    return re.sub(r"[/\\\s]", "_", name).replace("[", "(").replace("]", ")")[:DIRNAME_MAX]


OmegaConf.register_new_resolver("job_dirname", job_dirname, replace=True)


def write_record(job_dir: Path, record: dict[str, Any]) -> None:
    """job.json, replaced whole (a reader never sees half of it)."""
    write_atomic_in(job_dir, JOB_RECORD, json.dumps(record, indent=2))


def read_record(job_dir: Path) -> dict[str, Any] | None:
    """The job's job.json, None where there is none (or none whole)."""
    try:
        return json.loads((job_dir / JOB_RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def stop_reason(run_dir: Path) -> str | None:
    """How the run in `run_dir` ended (summary.json's `stopped`: max_steps, time limit, SIGINT, SIGTERM, ...)."""
    path = run_dir / layout.SUMMARY
    return json.loads(path.read_text()).get("stopped") if path.exists() else None


COMMAND_ID = "GPT_JAX_SWEEP_COMMAND"  # names the command a job runs for, in every process a launcher starts


def refuse_job(job_dir: Path, label: str) -> None:
    """A job refused at the door (a rerun into its finished run): its earlier record stays as it was, and this note
    says so to the sweep's summary, in whatever process (or machine) the launcher ran the job (joblib's, submitit's):
    it names the command (COMMAND_ID, set by training/cli/app.py), not a time another machine's clock would read."""
    write_atomic_in(job_dir, REFUSED, json.dumps({"job": label, "command": os.environ.get(COMMAND_ID)}))


def refused_jobs(sweep_dir: Path, command: str) -> list[str]:
    """The jobs this command (`command`: its COMMAND_ID) refused at the door, as `<num> (<overrides>)`, in job
    order."""
    notes = []
    for path in sweep_dir.rglob(REFUSED):
        try:
            note = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if note.get("command") == command:
            notes.append(note["job"])
    return sorted(notes, key=lambda label: int(label.split(" ", 1)[0]))


def read_records(sweep_dir: Path) -> list[dict[str, Any]]:
    records = [json.loads(p.read_text()) for p in sweep_dir.rglob(JOB_RECORD) if ".submitit" not in p.parts]
    return sorted(records, key=lambda r: r["job"])


def summarize_sweep(sweep_dir: Path) -> dict[str, Any]:
    """sweep.json and sweep.md from the jobs' records, and the comparison of their runs; returns what sweep.json
    holds (`jobs`, `completed`, `paused`: jobs that ended a checkpoint.num_steps segment, `failed`: the other jobs
    that did not complete, `best`: the completed job of the lowest final val loss)."""
    jobs = read_records(sweep_dir)
    numbered = {j["job"] for j in jobs}
    try:  # the planned jobs that never started (a sweep stopped before them) are listed too
        planned = json.loads((sweep_dir / PLAN).read_text()) if (sweep_dir / PLAN).exists() else []
    except (OSError, json.JSONDecodeError):
        planned = []
    jobs += [{"job": i, "overrides": o, "status": NOT_STARTED} for i, o in enumerate(planned) if i not in numbered]
    jobs.sort(key=lambda j: j["job"])
    try:  # what the sweep chose for each job: its overrides less the command's (a one-job or Optuna sweep's too)
        asked = _as_jobs_write(json.loads((sweep_dir / REQUEST).read_text()))
    except (OSError, ValueError, TypeError, HydraException):  # no request recorded: what the jobs do not share
        asked = set.intersection(*(set(j["overrides"]) for j in jobs)) if jobs else set()
    for j in jobs:  # how a job started and where it ran (a continued sweep's checkpoint.load=auto) tell none apart
        j["differs"] = [o for o in j["overrides"] if o not in asked and not _NOT_THE_JOBS.match(o)]
    done = [j for j in jobs if j["status"] == COMPLETED and finite_number(j.get("val_loss"))]
    best = min(done, key=lambda j: j["val_loss"]) if done else None
    paused = [j for j in jobs if j["status"] == PAUSED]
    failed = [j for j in jobs if j["status"] not in (COMPLETED, PAUSED)]
    summary = {
        "sweep_dir": str(sweep_dir),
        "completed": len(jobs) - len(failed) - len(paused),
        "paused": len(paused),
        "failed": len(failed),
        "best": best,
        "jobs": jobs,
    }
    (sweep_dir / "sweep.json").write_text(json.dumps(summary, indent=2))

    status = {
        COMPLETED: COMPLETED,
        FAILED: FAILED,
        RUNNING: "did not finish",
        STOPPED: "stopped by a signal",
        PAUSED: "paused (checkpoint.num_steps)",
    }
    rows = [
        {
            "job": j["job"],
            "status": status.get(j["status"], j["status"]),
            "val final": j.get("val_loss"),
            "overrides": " ".join(j["differs"]),
            "run": _relative(j["run_dir"], sweep_dir) if "run_dir" in j else None,
            "error": j.get("error"),
        }
        for j in jobs
    ]
    runs = [Path(j["run_dir"]) for j in jobs if "run_dir" in j and layout.is_run_dir(j["run_dir"])]
    lines = [
        f"# Sweep {sweep_dir.name}",
        "",
        f"{len(jobs)} jobs: {summary['completed']} completed, "
        + (f"{len(paused)} paused after a checkpoint.num_steps segment, " if paused else "")
        + f"{len(failed)} failed or unfinished.",
        "",
        markdown(["job", "status", "val final", "overrides", "run", "error"], rows),
    ]
    if best is not None:
        lines += [
            f"Best: job {best['job']}, final val loss {best['val_loss']:.4f} "
            f"({' '.join(best['differs']) or 'no overrides'}), {best['run_dir']}",
            "",
        ]
    if runs:
        lines += [
            "## The runs compared (scripts/tools/compare_runs.py: comparison.md, .csv, .png)",
            "",
            write_comparison(runs, sweep_dir),
        ]
    (sweep_dir / "sweep.md").write_text("\n".join(lines))
    return summary


def _as_jobs_write(overrides: list[str]) -> set[str]:
    """The command's fixed overrides as Hydra writes them into each job's (`logging.plot=false` -> `=False`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return {f"{o.get_key_element()}={o.get_value_element_as_str()}" for o in parsed if not o.is_sweep_override()}


def run_sweep(sweep_dir: Path, overrides: list[str], log: IO[str] | None = None) -> dict[str, Any]:
    """`python -m train_jax -m <overrides>` into `sweep_dir`, in a process of its own (its jobs one after another
    there, sharing the data and compiled steps); what its sweep.json holds. A sweep already summarised there is read,
    not run again, so an experiment that stopped picks up where it was; one stopped part way (a job stopped by a
    signal, or never started) is continued, its finished jobs read at their end. `log`: where the sweep's output goes
    (by default this process's). How the experiments run their grids (scripts/experiments/optimizer_leaderboard.py,
    schedule_search.py, mup_transfer.py). A folder that holds another sweep (other overrides) is refused: its
    jobs would be read as this sweep's."""
    summary, request = Path(sweep_dir) / "sweep.json", Path(sweep_dir) / REQUEST
    check_request(sweep_dir, overrides, what="sweep")
    if not request.exists() and summary.exists():
        raise PipelineError(
            f"sweep: {sweep_dir} holds a sweep whose overrides are not recorded (see its sweep.md); give this one "
            "another output folder, or remove that one to run it again"
        )
    if not request.exists() or not holds_jobs(Path(sweep_dir)):
        write_atomic_in(Path(sweep_dir), REQUEST, json.dumps(list(overrides)))
    unfinished = summary.exists() and any(
        j["status"] in (STOPPED, RUNNING, PAUSED, NOT_STARTED) for j in json.loads(summary.read_text())["jobs"]
    )
    if not summary.exists() or unfinished:  # a sweep stopped part way (a signal, a kill) continues where it stopped
        before = summary.stat().st_mtime_ns if summary.exists() else None
        command = [sys.executable, "-m", "train_jax", "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"]
        # its jobs that ran continue (checkpoint.load=auto), those that completed are read as they ended (app.py)
        command += ["checkpoint.load=auto"] if holds_jobs(Path(sweep_dir)) else []
        print("$ python train_jax.py", " ".join(command[3:]), flush=True)
        subprocess.run(command, check=False, stdout=log, stderr=subprocess.STDOUT if log else None)
        if not summary.exists() or summary.stat().st_mtime_ns == before:
            raise PipelineError(f"sweep: the multirun in {sweep_dir} wrote no sweep.json (its output says why)")
    return json.loads(summary.read_text())


def _relative(path: str, base: Path) -> str:
    try:
        return str(Path(path).relative_to(base))
    except ValueError:
        return path
