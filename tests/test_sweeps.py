"""train_jax.py as a Hydra application: `-m` sweeps (one run directory per job, a summary, a failed job failing
alone), the submitit launchers (local for real, SLURM's sbatch script without a cluster), the Optuna sweeper, --help
and shell completion, and a single run that leaves nothing of Hydra's behind. Every job is a real run of gpt2-tiny."""

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

import train_jax
from helpers import ROOT, read_metrics, run_cli, tiny_overrides
from training.config import as_dict, load_config
from training.config.help import field_meanings

SHORT = ["train.max_steps=2", "train.eval_interval=2", "train.eval_iters=1", "optimizer.lr_config.warmup=1"]


def sweep_command(data_cache, sweep_dir, *extra):
    return ["-m", *tiny_overrides(data_cache, *SHORT), f"hydra.sweep.dir={sweep_dir}", *extra]


def final_val_loss(run_dir: Path) -> float:
    return json.loads((run_dir / "summary.json").read_text())["splits"]["val"]["final_loss"]


def job_dirs(sweep_dir: Path) -> list[str]:
    return sorted(p.name for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def test_a_2x2_sweep_runs_four_jobs_each_in_its_own_run_directory_and_writes_a_summary(data_cache, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    assert (
        train_jax.command_line(sweep_command(data_cache, sweep, "train.seed=0,1", "optimizer.lr_config.lr=1e-3,3e-3"))
        == 0
    )
    # named by what each job varies (the overrides every job shares are left out), numbered in Hydra's order
    assert job_dirs(sweep) == [
        f"{i}-optimizer.lr_config.lr={lr},train.seed={seed}"
        for i, (seed, lr) in enumerate([(0, 0.001), (0, 0.003), (1, 0.001), (1, 0.003)])
    ]
    summary = json.loads((sweep / "sweep.json").read_text())
    assert (summary["completed"], summary["failed"]) == (4, 0)
    for job in summary["jobs"]:
        run_dir = Path(job["run_dir"])
        assert run_dir.parent == sweep and run_dir.name.startswith(f"{job['job']}-")
        assert {"metrics.jsonl", "config.yaml", "summary.json", "checkpoints", "job.json"} <= {
            p.name for p in run_dir.iterdir()
        }
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert (config["train"]["seed"], config["optimizer"]["lr_config"]["lr"]) == (
            job["job"] // 2,
            [1e-3, 3e-3][job["job"] % 2],
        )
        assert config["logging"]["run_dir"] == str(run_dir)
        assert job["status"] == "completed" and job["val_loss"] == final_val_loss(run_dir)  # what the job returned
    assert summary["best"]["job"] == min(summary["jobs"], key=lambda j: j["val_loss"])["job"]
    # the summary's comparison is training/reporting/compare.py's, run on the sweep directory: the swept keys are its
    # columns
    text = (sweep / "sweep.md").read_text()
    assert "| run | optimizer.lr_config.lr | train.seed | val final |" in text
    assert {"comparison.md", "comparison.csv", "comparison.png"} <= {p.name for p in sweep.iterdir()}
    assert f"sweep: 4 of 4 jobs completed; summary in {sweep / 'sweep.md'}" in capsys.readouterr().out
    # the same command again: each job refuses the run directory that holds its run, and the records of the jobs
    # that ran stay theirs (they were overwritten as failed, and the summary said 0 of 4 completed)
    records = {p: p.read_text() for p in sweep.rglob("job.json")}
    assert (
        train_jax.command_line(sweep_command(data_cache, sweep, "train.seed=0,1", "optimizer.lr_config.lr=1e-3,3e-3"))
        == 1
    )
    err = capsys.readouterr().err
    assert "already holds a run that trained" in err
    # exit 1 with a summary of 4 completed and no line saying why: the refused jobs are named
    assert err.strip().splitlines()[-1] == (
        f"error: sweep {sweep}: job 0 (optimizer.lr_config.lr=0.001,train.seed=0), 1 (optimizer.lr_config.lr=0.003,"
        "train.seed=0), 2 (optimizer.lr_config.lr=0.001,train.seed=1), 3 (optimizer.lr_config.lr=0.003,train.seed=1) "
        "refused (their runs are there already): checkpoint.load=auto continues them"
    )
    assert {p: p.read_text() for p in sweep.rglob("job.json")} == records
    assert json.loads((sweep / "sweep.json").read_text())["completed"] == 4
    # another sweep into its folder: its jobs ran beside these (2-train.seed=2 ...), and the summary read all of
    # them as one sweep's; now refused before anything runs
    summary = (sweep / "sweep.json").read_text()
    assert (
        train_jax.command_line(sweep_command(data_cache, sweep, "train.seed=2,3", "optimizer.lr_config.lr=1e-3")) == 2
    )
    assert capsys.readouterr().err == (
        f"error: hydra.sweep.dir: {sweep} holds another sweep's jobs ({' '.join(tiny_overrides(data_cache, *SHORT))} "
        "train.seed=0,1 optimizer.lr_config.lr=1e-3,3e-3); give this one another output folder, or remove that one "
        "to run it again\n"
    )
    assert (sweep / "sweep.json").read_text() == summary and len(job_dirs(sweep)) == 4


def test_a_sweep_of_segments_runs_every_jobs_segment_and_the_same_command_continues_them(data_cache, tmp_path, capsys):
    """checkpoint.num_steps in a sweep: each job's segment ended as asked, which was taken for a signal: the sweep
    stopped after its first job ('stopped by a signal', exit 1) and the others never ran."""
    sweep = tmp_path / "sweep"
    command = [*sweep_command(data_cache, sweep, "train.seed=0,1"), "train.max_steps=4", "checkpoint.num_steps=2"]
    assert train_jax.command_line(command) == 0
    steps = lambda: [max(r["step"] for r in read_metrics(sweep / d, "train")) for d in job_dirs(sweep)]  # noqa: E731
    assert steps() == [2, 2]
    out, err = capsys.readouterr()
    assert "stopped by a signal" not in err
    # a segment's loss is not a final one: the jobs were `completed`, the best of them the sweep's best (and an
    # Optuna trial's value)
    assert "sweep: 0 of 2 jobs completed, 2 paused after their checkpoint.num_steps segment (the same command" in out
    summary = json.loads((sweep / "sweep.json").read_text())
    assert [j["status"] for j in summary["jobs"]] == ["paused"] * 2 and summary["best"] is None
    assert (summary["completed"], summary["paused"], summary["failed"]) == (0, 2, 0)
    assert train_jax.command_line([*command, "checkpoint.load=auto"]) == 0
    assert steps() == [4, 4]
    summary = json.loads((sweep / "sweep.json").read_text())
    assert (summary["completed"], summary["paused"], summary["failed"]) == (2, 0, 0) and summary["best"] is not None
    assert "sweep: 2 of 2 jobs completed; summary in" in capsys.readouterr().out


def test_segments_under_an_optuna_sweeper_are_refused_before_anything_runs(data_cache, tmp_path, capsys):
    """The study took each job's step-3 loss of 8 steps as the trial's value (best_value in optimization_results.yaml),
    and a stored study continued by the same command held those beside the finished runs' values."""
    sweep = tmp_path / "sweep"
    command = sweep_command(data_cache, sweep, "hydra/sweeper=lr_search", "hydra.sweeper.n_trials=2")
    assert train_jax.command_line([*command, "checkpoint.num_steps=3"]) == 2
    assert capsys.readouterr().err == (
        "error: config: checkpoint.num_steps=3: an Optuna study takes each job's val loss as its trial's final value, "
        "and a segment's is not final (nor does a later study continue the trial): run the study's jobs whole\n"
    )
    assert not sweep.exists()
    # a sweeper that does not exist, beside segments: Hydra's one line (the check composing it raised a traceback)
    assert train_jax.command_line([*command, "hydra/sweeper=no_such", "checkpoint.num_steps=3"]) == 2
    assert capsys.readouterr().err.startswith("error: config: hydra/sweeper=no_such does not exist")


def test_a_sweep_is_the_same_sweep_in_another_order_and_continued_from_its_checkpoints():
    """What check_request compares: the overrides that choose the jobs, not their order, Hydra's settings or how the
    jobs start (the same command with checkpoint.load=auto continues a stopped sweep)."""
    from training.cli.sweep import same_sweep

    asked = ["train.seed=0,1", "optimizer=adamw,lion", "hydra.sweep.dir=a"]
    assert same_sweep(asked, ["optimizer=adamw,lion", "train.seed=0,1", "checkpoint.load=auto", "hydra.sweep.dir=b"])
    assert same_sweep(asked, [*asked, "+checkpoint.load_path=x", "hydra/launcher=submitit_local"])
    assert not same_sweep(asked, ["train.seed=0,1", "optimizer=adamw"])
    assert not same_sweep(asked, [*asked, "train.max_steps=9"])
    assert same_sweep([*asked, "system.process_id=0"], [*asked, "system.process_id=1"])  # launch_multihost.sh's
    # an Optuna study's sampler seed or search space chooses its jobs (another seed's study was taken into the
    # folder, and its summary listed two job 0s); more trials extend the same study
    study = [*asked, "hydra/sweeper=lr_search", "hydra.sweeper.n_trials=2"]
    assert not same_sweep(study, [*study, "hydra.sweeper.sampler.seed=1"])
    assert not same_sweep(study, [*study, "+hydra.sweeper.params={optimizer.weight_decay: interval(0, 0.2)}"])
    assert not same_sweep(study, asked)
    assert same_sweep(study, [*study, "hydra.sweeper.n_trials=20", "hydra.sweeper.n_jobs=2"])


def test_a_folder_whose_sweep_ran_no_job_takes_another_sweep(tmp_path):
    """A sweep Hydra refused before any job (a typo in a swept key) left its request: the corrected command into
    the same folder was refused as another sweep's."""
    from core.errors import PipelineError
    from training.cli.sweep import REQUEST, check_request, write_record

    (tmp_path / REQUEST).write_text(json.dumps(["train.bacth_size=8,16"]))
    check_request(tmp_path, ["train.batch_size=8,16"])
    write_record(tmp_path / "0-train.bacth_size=8", {"job": 0, "overrides": [], "status": "failed", "run_dir": "x"})
    with pytest.raises(PipelineError, match="holds another sweep's jobs"):
        check_request(tmp_path, ["train.batch_size=8,16"])


def test_a_bad_value_fails_its_job_with_one_line_while_the_other_runs_and_the_sweep_exits_1(
    data_cache, tmp_path, capsys
):
    sweep = tmp_path / "sweep"
    code = train_jax.command_line(sweep_command(data_cache, sweep, "optimizer.lr_config.lr=-0.1,1e-3"))
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert [line for line in lines if line.startswith("error: sweep job")] == [
        "error: sweep job 0 (optimizer.lr_config.lr=-0.1): config: optimizer.lr_config.lr: must be >= 0; got -0.1"
    ]
    assert lines[-1].startswith(f"error: sweep {sweep}: 1 of 2 jobs failed or did not finish (job 0)")
    failed, completed = json.loads((sweep / "sweep.json").read_text())["jobs"]
    assert failed["status"] == "failed" and failed["error"] == "config: optimizer.lr_config.lr: must be >= 0; got -0.1"
    assert [p.name for p in Path(failed["run_dir"]).iterdir()] == ["job.json"]  # nothing else written for it
    assert completed["status"] == "completed" and completed["val_loss"] == final_val_loss(Path(completed["run_dir"]))
    assert "| 0 | failed |  | optimizer.lr_config.lr=-0.1 |" in (sweep / "sweep.md").read_text()


@pytest.mark.e2e
@pytest.mark.soak
def test_submitit_local_runs_each_job_in_a_process_of_its_own(data_cache, tmp_path):
    """The jobs' processes start elsewhere (submitit's module, the test's scratch directory) and still import the
    project's modules: with no PYTHONPATH given, the one train_jax.py sets for them."""
    sweep = tmp_path / "sweep"
    result = run_cli(
        sweep_command(data_cache, sweep, "hydra/launcher=submitit_local", "optimizer.lr_config.lr=1e-3,3e-3"),
        env={"PYTHONPATH": None},
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_dirs(sweep) == ["0-optimizer.lr_config.lr=0.001", "1-optimizer.lr_config.lr=0.003"]
    jobs = json.loads((sweep / "sweep.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["completed", "completed"]
    for job in jobs:
        assert job["val_loss"] == final_val_loss(Path(job["run_dir"]))
    # each job's training output is in its submitit log, not the launching process's
    logs = sorted((sweep / ".submitit").glob("*/*_0_log.out"))
    assert len(logs) == 2 and all("final evaluation at step 2" in log.read_text() for log in logs)
    assert "final evaluation" not in result.stdout
    # the same command again: its jobs refuse their finished runs in their own processes, where the list that named
    # them lived: the sweep said '2 of 2 jobs completed' and exited 1 without a word of why
    again = run_cli(
        sweep_command(data_cache, sweep, "hydra/launcher=submitit_local", "optimizer.lr_config.lr=1e-3,3e-3"),
        env={"PYTHONPATH": None},
        timeout=240,
    )
    assert again.returncode == 1
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: sweep {sweep}: job 0 (optimizer.lr_config.lr=0.001), 1 (optimizer.lr_config.lr=0.003) refused "
        "(their runs are there already): checkpoint.load=auto continues them"
    )


FAKE_SLURM = """#!/bin/sh
# sbatch and srun where there is no SLURM: sbatch keeps the script it is given and refuses it
[ "$(basename "$0")" = srun ] && exit 1
cp "$1" "$SBATCH_SCRIPT"
echo "sbatch: error: no cluster here" >&2
exit 1
"""


def fake_slurm(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "srun"):
        (bin_dir / name).write_text(FAKE_SLURM)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SBATCH_SCRIPT": str(tmp_path / "submitted.sh")}


def test_the_slurm_launcher_submits_an_array_with_the_configured_nodes_tasks_and_gpus(tmp_path):
    """What hydra/launcher=submitit_slurm hands to sbatch, written by submitit from the launcher's keys: one array
    task per job, each `nodes` x `tasks_per_node` processes started by srun (which give each its SLURM_PROCID)."""
    sweep = tmp_path / "sweep"
    result = run_cli(
        [
            "-m",
            "model=gpt2-tiny",
            f"hydra.sweep.dir={sweep}",
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.nodes=2",
            "hydra.launcher.tasks_per_node=4",
            "hydra.launcher.gpus_per_node=4",
            "hydra.launcher.timeout_min=30",
            "hydra.launcher.partition=gpu",
            "hydra.job.name=lr-search",
            "optimizer.lr_config.lr=1e-3,3e-3",
        ],
        env=fake_slurm(tmp_path),
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: sweep: FailedJobError: sbatch: error: no cluster here"
    script = (tmp_path / "submitted.sh").read_text()
    for line in [
        "#SBATCH --array=0-1%2",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --time=30",
        "#SBATCH --partition=gpu",
        "#SBATCH --job-name=lr-search",
    ]:
        assert line in script.splitlines(), script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert srun.endswith(f"{sys.executable} -u -m submitit.core._submit {sweep}/.submitit/%j"), srun


def test_the_slurm_preset_starts_one_process_per_gpu(tmp_path):
    result = run_cli(
        [
            "-m",
            "model=gpt2-tiny",
            f"hydra.sweep.dir={tmp_path}/sweep",
            "hydra/launcher=slurm",
            "optimizer.lr_config.lr=1e-3,3e-3",
        ],
        env=fake_slurm(tmp_path),
        timeout=120,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    lines = (tmp_path / "submitted.sh").read_text().splitlines()
    assert {"#SBATCH --nodes=1", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=8"} <= set(lines)


def test_an_optuna_study_of_3_trials_reports_the_lr_of_the_run_that_returned_the_lowest_loss(data_cache, tmp_path):
    sweep = tmp_path / "sweep"
    assert (
        train_jax.command_line(sweep_command(data_cache, sweep, "hydra/sweeper=lr_search", "hydra.sweeper.n_trials=3"))
        == 0
    )
    jobs = json.loads((sweep / "sweep.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["completed"] * 3
    lrs = [
        yaml.safe_load((Path(j["run_dir"]) / "config.yaml").read_text())["optimizer"]["lr_config"]["lr"] for j in jobs
    ]
    assert len(set(lrs)) == 3 and all(1e-4 <= lr <= 3e-2 for lr in lrs)  # drawn from the preset's interval
    losses = [final_val_loss(Path(j["run_dir"])) for j in jobs]
    assert [j["val_loss"] for j in jobs] == losses  # each trial's value is its run's final val loss
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    lowest = losses.index(min(losses))
    assert best["best_params"] == {"optimizer.lr_config.lr": lrs[lowest]} and best["best_value"] == losses[lowest]


def test_help_lists_the_groups_launchers_sweepers_and_every_key_with_its_type_default_and_meaning(capsys):
    assert train_jax.command_line(["--help", "model=gpt2-tiny"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for line in [
        "model: gpt2, gpt2-large, gpt2-medium, gpt2-micro, gpt2-mini, gpt2-tiny, gpt2-xl, llama-1.5b, "
        "llama-124m, llama-350m, llama-774m, llama-micro, llama-mini, llama-tiny, modern-gpt, opt-track, "
        "opt-track-micro, speedrun-micro",
        "optimizer/lr_config: constant, cosine, linear, piecewise_linear, trapezoid",
        "hydra/launcher: basic, joblib, slurm, submitit_local, submitit_slurm",
        "hydra/sweeper: basic, lr_search, optuna",
    ]:
        assert line in lines, out
    assert any(line.startswith("dataset: fineweb10b, fineweb_edu, hf, json_files,") for line in lines)

    def leaves(node, prefix=""):
        for key, value in node.items():
            yield from leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]

    listed = {line.split(":")[0].strip() for line in lines if line.startswith("  ") and ": " in line}
    assert set(leaves(as_dict(load_config([])))) <= listed
    for line in [
        "train.batch_size: int = 16 -- sequences per micro-batch per process, split over the process's devices",
        "model.n_layer: int = 6 (here: 2) -- transformer blocks",  # the default, then this command line's
        "dataset.context_size: int or null = null -- tokens per training window; null = model.context_size",
    ]:
        assert "  " + line in lines, out
    assert "  system.dtype: float32 | bfloat16 | float16 | fp8 = float32 -- compute dtype" in lines, out  # a choice
    assert any(
        line.startswith("  checkpoint.load: str = false -- true: resume from load_path; false: start fresh;")
        for line in lines
    )  # a meaning written in the comment lines above the field


def test_a_fields_meaning_is_its_comment_lines_above_and_its_trailing_comment(tmp_path, monkeypatch):
    (tmp_path / "schema_example.py").write_text(
        "from dataclasses import dataclass\n\n\n@dataclass\nclass Example:\n"
        "    plain: int = 1\n"
        "    # first line above\n    # second line above\n    both: str = 'x'  # and beside\n"
        "\n    # a comment a blank line away belongs to no field\n\n"
        "    beside: float = 0.5  # only beside (a # inside it stays)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from schema_example import Example

    assert field_meanings(Example) == {
        "plain": "",
        "both": "first line above second line above and beside",
        "beside": "only beside (a # inside it stays)",
    }


def test_hydras_own_help_and_shell_completion_work(capsys, monkeypatch):
    result = run_cli(["--hydra-help"], timeout=60)  # it sets up Hydra's logging on stdout: a process of its own
    assert result.returncode == 0 and "== Flags ==" in result.stdout, result.stderr[-2000:]
    assert train_jax.command_line(["-sc", "install=bash"]) == 0
    assert "hydra_bash_completion" in capsys.readouterr().out
    line = "python train_jax.py optimizer/lr_config="
    monkeypatch.setenv("COMP_LINE", line)
    monkeypatch.setenv("COMP_POINT", str(len(line)))
    assert train_jax.command_line(["-sc", "query=bash"]) == 0
    assert capsys.readouterr().out.split() == [
        f"optimizer/lr_config={name}" for name in ["constant", "cosine", "linear", "piecewise_linear", "trapezoid"]
    ]
    # bash's completion script only offers it for scripts whose source says @hydra.main
    assert "@hydra.main(" in (ROOT / "train_jax.py").read_text()


@pytest.mark.parametrize(
    "args, line",
    [  # each was a ValueError traceback from Hydra (under -m the same mistakes were one line already)
        (["-sc", "bogus"], "error: Expecting one subcommand from ['install', 'uninstall', 'query'] to be set"),
        (["--cfg", "job", "--info"], "error: Only one of --run, --multirun, --cfg, --info and --shell_completion"),
    ],
)
def test_hydras_own_flags_misused_are_one_line_and_a_usage_exit(args, line, capsys):
    assert train_jax.command_line(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err


def test_a_key_given_fixed_and_swept_names_the_job_directories():
    """`train.max_steps=4 ... train.max_steps=2,3` (a fixed list of overrides, then a sweep over one of them): the
    jobs were named 0 and 1, the swept key left out as one every job shares."""
    from training.cli.app import EXCLUDE_KEYS, name_jobs_by_what_varies

    argv = ["-m", "train.max_steps=4", "train.seed=0", "train.max_steps=2,3"]
    assert name_jobs_by_what_varies(argv) == ["-m", f"{EXCLUDE_KEYS}=['train.seed']", *argv[1:]]


def test_a_flag_after_the_overrides_is_read_as_hydra_reads_it_and_a_bad_one_prints_its_usage_once(capsys):
    """`train.seed=1,2 train.max_steps=2 -m`, which Hydra takes, was refused: the job-naming override, appended after
    `-m`, made a second run of overrides, which Hydra's parser does not take (an 'unrecognized argument' the user
    never typed); and every mistaken flag printed Hydra's usage three times (each read of the command printed it)."""
    from training.cli.app import EXCLUDE_KEYS, _parsed, name_jobs_by_what_varies

    argv = ["train.seed=1,2", "train.max_steps=2", "-m"]
    named = name_jobs_by_what_varies(argv)
    assert named == [f"{EXCLUDE_KEYS}=['train.max_steps']", *argv]
    assert _parsed(named).overrides == named[:3] and _parsed(named).multirun
    assert train_jax.command_line(["train.seed=1", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("usage: ") == 1 and err.endswith("error: unrecognized arguments: --bogus\n"), err
    train_jax.command_line(["--version"])
    assert capsys.readouterr().out.count("Hydra ") == 1  # it was printed four times


def test_a_sweep_of_no_job_says_so_and_exits_2(tmp_path, capsys):
    """An empty range printed nothing and exited 0."""
    sweep = tmp_path / "sweep"
    assert train_jax.command_line(["-m", "train.seed=range(0,0)", f"hydra.sweep.dir={sweep}"]) == 2
    assert capsys.readouterr().err == f"error: sweep {sweep}: the sweep has no job (a value list or range is empty)\n"


@pytest.mark.e2e
def test_a_single_run_writes_only_its_run_directory_in_the_working_directory(data_cache, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = run_cli(tiny_overrides(data_cache, *SHORT, "optimizer.lr_config.lr=1e-3"), cwd=cwd, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in cwd.iterdir()] == ["runs"]  # no outputs/, multirun/, .hydra/ or train_jax.log
    (run_dir,) = (cwd / "runs").iterdir()
    assert run_dir.name.startswith("gpt2-tiny-pystdlib-")
    assert {"metrics.jsonl", "config.yaml", "summary.json", "checkpoints"} <= {p.name for p in run_dir.iterdir()}
    assert not [p for p in cwd.rglob("*") if p.name in (".hydra", "job.json") or p.suffix == ".log"]


def test_a_list_valued_override_names_its_job_directory_without_brackets(tmp_path):
    """TensorStore reads a path holding `[...]` as a pattern: Orbax saves there and then restores nothing. A sweep
    over a list (scripts/experiments/schedule_search.py sweeps boundary_lrs) names its jobs with parentheses, and a
    checkpoint path with brackets is one config line."""
    from core.errors import ConfigError
    from training.checkpoints.storage import check_writable
    from training.cli.sweep import job_dirname

    assert (
        job_dirname(1, "optimizer.lr_config.boundary_lrs=[0.003,0.001]")
        == "1-optimizer.lr_config.boundary_lrs=(0.003,0.001)"
    )
    check_writable("checkpoint.save_path", tmp_path / "1-x=(0.003,0.001)" / "checkpoints")
    with pytest.raises(ConfigError, match=r"^checkpoint.save_path: .* holds a bracketed name \(\[\.\.\.\]\)"):
        check_writable("checkpoint.save_path", tmp_path / "1-x=[0.003,0.001]" / "checkpoints")


def test_the_experiments_runner_runs_a_multirun_in_its_own_process_once_and_fails_in_one_line(data_cache, tmp_path):
    """training/cli/sweep.py's run_sweep (the optimizer leaderboard's, the schedule search's and the μP transfer's):
    a multirun in a process of its own, its output in the given log; a finished sweep is read again, not rerun; a
    multirun that writes no sweep.json (an option that does not exist) is one line naming the directory."""
    from core.errors import PipelineError
    from training.cli.sweep import run_sweep

    sweep = tmp_path / "sweep"
    overrides = [*sweep_command(data_cache, sweep)[1:-1], "optimizer.lr_config.lr=1e-3,3e-3"]
    with open(tmp_path / "sweep.log", "w") as log:
        summary = run_sweep(sweep, overrides, log)
    assert (summary["completed"], summary["failed"]) == (2, 0)
    assert "sweep: 2 of 2 jobs completed" in (tmp_path / "sweep.log").read_text()
    written = (sweep / "sweep.json").stat().st_mtime_ns
    assert run_sweep(sweep, overrides, log=None) == summary  # read, not run
    assert (sweep / "sweep.json").stat().st_mtime_ns == written
    # another sweep into its folder (a schedule search rerun with other lrs) was read as this one's results
    other = [*overrides[:-1], "optimizer.lr_config.lr=3e-2,1e-4"]
    with pytest.raises(
        PipelineError,
        match=rf"^sweep: {sweep} holds another sweep's jobs \(.* optimizer.lr_config.lr="
        r"1e-3,3e-3\); give this one another output folder",
    ):
        run_sweep(sweep, other)
    assert (sweep / "sweep.json").stat().st_mtime_ns == written
    with open(tmp_path / "bad.log", "w") as log, pytest.raises(PipelineError) as failure:
        run_sweep(tmp_path / "bad", [*tiny_overrides(data_cache, *SHORT), "optimizer=no_such_optimizer"], log)
    assert str(failure.value) == (
        f"sweep: the multirun in {tmp_path / 'bad'} wrote no sweep.json (its output says why)"
    )
    assert "no_such_optimizer" in (tmp_path / "bad.log").read_text()


def test_sigterm_while_a_job_starts_stops_the_sweep_with_its_summary(data_cache, tmp_path):
    """A scheduler's SIGTERM between jobs or while one starts (before its loop takes the signal) killed the sweep:
    exit 143, no summary, its job left `running`. Now as Ctrl-C: the sweep stops, says how to continue, exit 1."""
    import signal
    import time

    from helpers import communicate, start

    sweep = tmp_path / "sweep"
    proc = start(sweep_command(data_cache, sweep, "train.max_steps=5000", "train.seed=1,2"))
    deadline = time.time() + 60
    while not list(sweep.glob("0-*/job.json")):
        assert time.time() < deadline and proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    done = communicate(proc, 120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"error: sweep: stopped by a signal; the same command with hydra.sweep.dir={sweep}" in done.stderr
    summary = json.loads((sweep / "sweep.json").read_text())
    # job 1 never started: it was left out, and the summary said `1 jobs` of a sweep of two
    assert summary["completed"] == 0 and [job["job"] for job in summary["jobs"]] == [0, 1]
    assert summary["jobs"][1]["status"] == "not started" and summary["jobs"][1]["differs"] == ["train.seed=2"]
    assert "2 jobs: 0 completed, 2 failed or unfinished." in (sweep / "sweep.md").read_text()


@pytest.mark.parametrize("lost", ["turned into another error", "swallowed"])
def test_a_signal_during_a_jobs_set_up_stops_the_sweep_whatever_the_set_up_makes_of_it(
    data_cache, tmp_path, monkeypatch, capsys, lost
):
    """SIGTERM while datasets looked for the corpus's files came out of it as a FileNotFoundError: job 0 failed as a
    bug and the sweep went on to job 1 (a KeyboardInterrupt raised in a finalizer is lost the same way, printed as
    'Exception ignored'). The sweep stops either way: at once, or after the job's first step, with a checkpoint."""
    import os
    import signal

    from training.pipeline import build as build_module

    load_data = build_module.load_data

    def interrupted(*args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:
            if lost == "turned into another error":
                raise FileNotFoundError("Unable to find '/usr/lib/python3.11/encodings/hex_codec.py'") from None
        return load_data(*args)

    monkeypatch.setattr(build_module, "load_data", interrupted)
    sweep = tmp_path / "sweep"
    assert train_jax.command_line(sweep_command(data_cache, sweep, "train.seed=1,2")) == 1
    err = capsys.readouterr().err
    assert f"error: sweep: stopped by a signal; the same command with hydra.sweep.dir={sweep}" in err
    assert "a bug" not in err and "FileNotFoundError" not in err
    jobs = json.loads((sweep / "sweep.json").read_text())["jobs"]
    assert [(j["status"], j.get("stopped")) for j in jobs] == [("stopped", "SIGTERM"), ("not started", None)]


def test_an_experiments_sweep_stopped_part_way_is_continued_not_read_as_done(tmp_path, monkeypatch):
    """run_sweep read any sweep.json as a finished sweep's: an experiment stopped during its sweep ranked the
    stopped job's partial loss and never ran the jobs after it. Such a sweep runs again with checkpoint.load=auto
    (its finished jobs are read at their end); a finished one is read."""
    import subprocess

    from training.cli import sweep as sweep_lib

    overrides = ["train.seed=1,2"]
    sweep_lib.write_atomic_in(tmp_path, sweep_lib.REQUEST, json.dumps(overrides))
    jobs = [{"job": 0, "status": "completed"}, {"job": 1, "status": "not started"}]
    (tmp_path / "sweep.json").write_text(json.dumps({"jobs": jobs}))
    ran = []

    def multirun(command, **kwargs):
        ran.append(command)
        done = [{**job, "status": "completed"} for job in jobs]
        (tmp_path / "sweep.json").write_text(json.dumps({"jobs": done}))

    monkeypatch.setattr(subprocess, "run", multirun)
    assert [j["status"] for j in sweep_lib.run_sweep(tmp_path, overrides)["jobs"]] == ["completed"] * 2
    assert len(ran) == 1 and ran[0][-1] == "checkpoint.load=auto"
    sweep_lib.run_sweep(tmp_path, overrides)
    assert len(ran) == 1  # finished: read, not run
    # killed before it wrote a summary: its jobs' records say it ran; it continued only at the second call
    (tmp_path / "sweep.json").unlink()
    sweep_lib.write_record(tmp_path / "0-train.seed=1", {"job": 0, "overrides": [], "status": "running"})
    sweep_lib.run_sweep(tmp_path, overrides)
    assert len(ran) == 2 and ran[1][-1] == "checkpoint.load=auto"


def test_a_continued_sweep_reads_its_completed_jobs_without_a_checkpoint_as_they_ended(data_cache, tmp_path, capsys):
    """checkpoint.load=auto found no checkpoint in a completed job's run (checkpoint.save=false, as the experiments'
    sweeps run), set its logs aside and trained it again from step 0."""
    sweep = tmp_path / "sweep"
    command = [*sweep_command(data_cache, sweep, "train.seed=0,1"), "checkpoint.save=false"]
    assert train_jax.command_line(command) == 0
    metrics = {p: p.read_text() for p in sweep.glob("*/metrics.jsonl")}
    summary = json.loads((sweep / "sweep.json").read_text())
    capsys.readouterr()
    assert train_jax.command_line([*command, "checkpoint.load=auto"]) == 0
    out = capsys.readouterr().out
    assert "sweep job 0: completed before, val " in out and "sweep job 1: completed before" in out
    assert {p: p.read_text() for p in sweep.glob("*/metrics.jsonl")} == metrics and not list(
        sweep.glob("*/abandoned-*")
    )
    continued = json.loads((sweep / "sweep.json").read_text())["jobs"]
    assert [j["val_loss"] for j in continued] == [j["val_loss"] for j in summary["jobs"]]
    assert [j["differs"] for j in continued] == [["train.seed=0"], ["train.seed=1"]]  # not checkpoint.load=auto


def test_a_one_job_studys_summary_names_what_the_sweeper_chose(tmp_path):
    """The overrides that tell a job apart were those the jobs do not share: a study of one trial (or a sweep's one
    job) showed none, and its best read `(no overrides)`. They are the job's overrides less the command's."""
    from training.cli.sweep import REQUEST, summarize_sweep, write_record

    (tmp_path / REQUEST).write_text(json.dumps(["model=gpt2-tiny", "hydra/sweeper=lr_search"]))
    overrides = ["optimizer.lr_config.lr=0.0023", "model=gpt2-tiny"]
    record = {"job": 0, "overrides": overrides, "status": "completed", "val_loss": 4.2, "run_dir": str(tmp_path / "0")}
    write_record(tmp_path / "0", record)
    summary = summarize_sweep(tmp_path)
    assert summary["best"]["differs"] == ["optimizer.lr_config.lr=0.0023"]
    assert "Best: job 0, final val loss 4.2000 (optimizer.lr_config.lr=0.0023)" in (tmp_path / "sweep.md").read_text()
