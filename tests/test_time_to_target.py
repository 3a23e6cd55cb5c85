"""scripts/experiments/time_to_target.py: where a curve first reaches the target, the fractions of the baseline's run,
and the whole script on tiny runs (its record, table and picture; finished runs not run again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import helpers
import train_jax
from helpers import ROOT, read_metrics
from scripts.experiments import time_to_target as ttt


def points(losses, step=10):
    return [
        {"step": step * (i + 1), "tokens": 100 * (i + 1), "seconds": 2.0 * (i + 1), "loss": x, "nats_per_byte": x / 2}
        for i, x in enumerate(losses)
    ]


def test_the_crossing_is_interpolated_between_the_evaluations_around_it():
    assert ttt.crossing(points([5.0, 4.0, 3.0]), 3.5) == {"tokens": 250.0, "seconds": 5.0}
    assert ttt.crossing(points([3.0, 2.0]), 3.5) == {"tokens": 100, "seconds": 2.0}  # reached at the first evaluation
    assert ttt.crossing(points([5.0, 4.0]), 3.5) is None


def test_fractions_are_of_the_baselines_whole_run_averaged_over_seeds():
    runs = {
        "baseline": [points([5.0, 4.0, 3.0, 2.0]), points([5.0, 4.0, 3.0, 2.2])],  # target 2.1
        "recipe": [points([4.0, 2.1, 1.5, 1.0]), points([4.0, 3.1, 2.1, 1.9])],  # reach it at 200 and 300 tokens
        "slow": [points([5.0, 4.0, 3.0, 2.5]), points([5.0, 4.0, 3.0, 2.0])],
    }
    summary = ttt.summarize(runs)
    assert summary["target_val_loss"] == pytest.approx(2.1)
    recipe = summary["variants"]["recipe"]
    assert recipe["tokens_fraction"] == pytest.approx(250 / 400) and recipe["seconds_fraction"] == pytest.approx(5 / 8)
    assert recipe["final_val_nats_per_byte"] == pytest.approx((0.5 + 0.95) / 2)
    assert summary["variants"]["slow"]["tokens_fraction"] is None  # one seed never reaches it
    assert "| slow | 2 | reached by 1 of 2 seeds | reached by 1 of 2 seeds |" in ttt.table(summary)
    summary = ttt.summarize({"baseline": runs["baseline"], "never": [points([5.0, 4.0]), points([5.0, 4.5])]})
    assert "| never | 2 | not reached | not reached |" in ttt.table(summary)


def test_an_evaluation_before_the_first_step_has_no_time_and_the_summary_says_so():
    """train.eval_at_start logs val at step 0, with no train row and so no seconds: a crossing after it has tokens
    and no seconds (a KeyError ended the script)."""
    start = {"step": 0, "tokens": 0, "seconds": None, "loss": 6.0, "nats_per_byte": 3.0}
    assert ttt.crossing([start, *points([2.0])], 4.0) == {"tokens": 50.0, "seconds": None}
    runs = {"baseline": [[start, *points([5.0, 4.0, 3.0])]], "fast": [[start, *points([2.0, 1.0, 0.5])]]}
    summary = ttt.summarize(runs)
    fast = summary["variants"]["fast"]
    assert fast["tokens_fraction"] == pytest.approx(75 / 300) and fast["seconds_fraction"] is None  # 6 -> 2: 3 at 3/4
    assert "| fast | 1 | 25.0% | no time logged |" in ttt.table(summary)


@pytest.mark.soak
def test_the_script_runs_each_variant_once_and_writes_its_record_table_and_picture(
    tmp_path, data_cache, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    out = Path("ttt")  # relative, as the README's `--out runs/ttt`: the runs went to the checkout's ttt/
    tiny = [
        "model.n_layer=2",
        "model.n_embd=64",
        "model.n_head=2",
        "model.context_size=32",
        "dataset.tokenizer=byte",
        "dataset.max_documents=24",
        "dataset.num_proc=1",
        f"dataset.cache_dir={data_cache}",
        "system.num_devices=1",
        "train.eval_iters=1",
        f"system.compilation_cache_dir={helpers.COMPILE_CACHE}",
    ]
    argv = ["--out", str(out), "--seeds", "1", "--steps", "4", "--eval-every", "2", "--", *tiny]
    # the baseline's run stopped half way (as a signal stops it, with a checkpoint): the script continues it; it was
    # refused ('already holds a run that trained'), and the script stopped
    stopped = [*ttt.run_overrides(ttt.BASELINE, out / "baseline-s0", 0, 4, 2), *tiny, "checkpoint.num_steps=2"]
    assert train_jax.command_line(stopped) == 0 and not ttt.finished(out / "baseline-s0", 4)
    assert ttt.main(argv) == 0
    assert [r["step"] for r in read_metrics(out / "baseline-s0", "train")] == [2, 4]  # each logged once
    record = json.loads((out / "time_to_target.json").read_text())
    assert set(record["runs"]) == {"baseline", "recipe"} and [p["step"] for p in record["runs"]["recipe"][0]] == [2, 4]
    baseline = record["summary"]["variants"]["baseline"]
    assert baseline["crossings"][0] is not None and (out / "time_to_target.png").stat().st_size > 1000
    assert "| recipe | 1 |" in (out / "time_to_target.md").read_text()
    stamp = (out / "recipe-s0" / "metrics.jsonl").stat().st_mtime
    assert ttt.main(argv) == 0  # finished: nothing runs again
    assert (out / "recipe-s0" / "metrics.jsonl").stat().st_mtime == stamp
    # another budget into the folder: its runs were skipped as finished and the table named the new budget
    for other in (["--steps", "2"], ["--eval-every", "1"], ["--summarize", "--steps", "8"], ["--", *tiny[:-1]]):
        asked = ["--out", str(out), "--seeds", "1", "--steps", "4", "--eval-every", "2", *other]
        asked = asked if "--" in other else [*asked, "--", *tiny]
        capsys.readouterr()
        assert ttt.main(asked) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out: {out} holds the runs of --steps 4 --eval-every 2 -- model.n_layer=2 ")
        assert "choose another --out, or the same settings" in err and len(err.strip().splitlines()) == 1, err
    assert (out / "recipe-s0" / "metrics.jsonl").stat().st_mtime == stamp
    assert not ttt.finished(out / "recipe-s0", 2) and ttt.finished(out / "recipe-s0", 4)
    (out / ttt.REQUEST).write_text('{"steps": ')  # cut off: one line, not a JSONDecodeError
    assert ttt.main(argv) == 1 and "is unreadable (JSONDecodeError); repair or remove it" in capsys.readouterr().err
    assert (ROOT / "conf" / "model" / "speedrun-micro.yaml").exists()


def test_a_refused_only_leaves_the_folder_without_a_recorded_comparison(tmp_path, monkeypatch, capsys):
    """`--only nosuch` was refused after the folder had recorded the default settings as its comparison: the
    corrected command at other --steps was then refused, the folder 'holding the runs' of settings it never ran."""

    def ran(*args):
        raise AssertionError("past the refusal: it would have made data and trained")

    monkeypatch.setattr(ttt, "prepare_data", ran)
    out = tmp_path / "ttt"
    with pytest.raises(SystemExit) as e:
        ttt.main(["--out", str(out), "--only", "nosuch"])
    assert e.value.code == 2 and "--only: no variant nosuch" in capsys.readouterr().err
    assert not (out / ttt.REQUEST).exists()
    # an unknown key after `--`: refused when the data was made, after the folder had recorded it
    assert ttt.main(["--out", str(out), "--steps", "4", "--", "train.sed=1"]) == 2
    assert "unknown key 'train.sed'" in capsys.readouterr().err and not (out / ttt.REQUEST).exists()


def test_a_run_that_ends_before_its_last_step_stops_the_script_in_one_line(tmp_path, monkeypatch, capsys):
    """A run stopped by a signal exits 0 with a checkpoint: the script went on to the next variant, and its table
    read the unfinished run as missing."""
    import subprocess

    monkeypatch.setattr(ttt, "prepare_data", lambda *args: None)
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: subprocess.CompletedProcess(args, 0))
    assert ttt.main(["--out", str(tmp_path / "ttt"), "--seeds", "1", "--steps", "4"]) == 1
    assert capsys.readouterr().err == "error: baseline seed 0 stopped before step 4; the same command continues it\n"


def test_the_data_is_made_before_the_runs_without_starting_jax_in_the_scripts_process(tmp_path, data_cache):
    """The script stays alive beside every run: starting JAX's backend there (jax.process_index in the data's
    build) would hold most of a GPU's memory through all of them. Its relative cache folder is the runs': theirs
    start in the checkout."""
    import subprocess
    import sys

    code = (
        "from jax._src import xla_bridge\n"
        "from scripts.experiments import time_to_target as t\n"
        "t.prepare_data({'baseline': t.BASELINE}, 4, 2, ['dataset.tokenizer=byte', 'dataset.max_documents=24', "
        f"'dataset.num_proc=1', 'dataset.cache_dir={tmp_path}/cache', 'model.context_size=32'])\n"
        "print(xla_bridge.backends_are_initialized())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert list((tmp_path / "cache" / "tokens").iterdir())  # the token store the runs will open
