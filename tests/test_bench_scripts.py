"""The benchmark scripts bench_data.py, bench_loop.py, bench_checkpoint.py and records.py: what they measure and how
they refuse bad input (one line, `error: ...`, a non-zero exit). bench_data's and bench_loop's training runs are
subprocesses of half a minute each: here a stand-in for train_jax.py answers them, as the real one would."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from scripts.benchmarks import bench_checkpoint, bench_data, bench_loop, records


def one_line_error(err: str, *words: str) -> None:
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert all(w in err for w in words), err


def exit_code(main, argv: list[str]) -> int:
    """`main(argv)`'s exit status, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


# --- bench_data ------------------------------------------------------------------------------------------------------


class TrainJaxStandIn:
    """train_jax.py as bench_data sees it: it refuses a run folder that holds a trained run (as resume.py does), else
    "trains" there and prints the lines bench_data times."""

    runs: list[Path] = []

    def __init__(self, cmd: list[str], **_) -> None:
        run_dir = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("logging.run_dir=")))
        self.runs.append(run_dir)
        if (run_dir / "metrics.jsonl").exists():
            self.stdout, self.code = [f"error: logging.run_dir: {run_dir} already holds a run that trained\n"], 2
        else:
            run_dir.mkdir(parents=True)
            (run_dir / "metrics.jsonl").write_text("{}\n")
            self.stdout, self.code = ["data       text_files\n", "first step done\n", "peak_rss_kb=2048\n"], 0

    def wait(self) -> int:
        return self.code


def test_bench_data_trains_each_run_in_a_fresh_folder_and_times_the_build_itself(tmp_path, monkeypatch, capsys):
    """Every run, of this invocation and of the next, gets a run folder without a trained run; the build's rate is
    the tokens over the build's own seconds; corpus_bytes is the parsed size."""
    import data.packing  # noqa: F401  (imported before Popen is replaced: the yardstick's import)

    monkeypatch.setattr(subprocess, "Popen", TrainJaxStandIn)
    monkeypatch.setattr(TrainJaxStandIn, "runs", [])
    monkeypatch.setattr(bench_data, "time_build", lambda *args: 0.25)
    argv = ["--tokens", "10K", "--work", str(tmp_path), "--checkout", str(tmp_path)]
    for _ in range(2):
        assert bench_data.main(argv) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(TrainJaxStandIn.runs) == 4 and len(set(TrainJaxStandIn.runs[:2])) == 2
    for result in out:
        assert result["corpus_bytes"] == 10_000 and result["tokens"] == 10_000
        assert result["build_s"] == 0.25 and result["build_tokens_per_s"] == 40_000
        assert result["first"]["peak_rss_mb"] == 2 and result["encode_documents_tokens_per_s"] > 0


def test_bench_data_times_the_checkouts_build_or_says_it_cannot(tmp_path, capsys):
    corpus = bench_data.generate_corpus(tmp_path / "corpus", 4 << 20)  # files enough for a validation split
    cache = tmp_path / "cache"
    seconds = bench_data.time_build(Path(bench_data.__file__).parents[2], corpus, cache, {"kind": "byte"})
    assert seconds > 0 and bench_data.store_tokens(cache) > 4 << 20  # built again: the bytes and an <EOS> per file
    old = tmp_path / "old"  # a checkout whose data/ cannot build a token store
    (old / "data").mkdir(parents=True)
    (old / "data" / "__init__.py").write_text("raise ImportError('no token store here')")
    assert bench_data.time_build(old, corpus, cache, {"kind": "byte"}) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: the build could not be timed"), err


def test_bench_data_yardstick_is_encode_documents_over_bytes(tmp_path, monkeypatch):
    """What the build calls, over the first `limit` bytes: 1,000 two-byte characters fill a 1,500-byte limit."""
    from data.tokenizers import ByteTokenizer

    (tmp_path / "part-00000.py").write_text("é" * 1000)
    (tmp_path / "part-00001.py").write_text("x" * 1000)
    seen = []
    real = ByteTokenizer.encode_documents
    monkeypatch.setattr(ByteTokenizer, "encode_documents", lambda self, texts: seen.extend(texts) or real(self, texts))
    assert bench_data.encode_rate(tmp_path, {"kind": "byte"}, limit=1500) > 0
    assert seen == ["é" * 1000]


@pytest.mark.parametrize("size", ["10X", "", "-5", "0"])
def test_bench_data_refuses_a_size_it_cannot_read(size, tmp_path, capsys):
    assert exit_code(bench_data.main, ["--tokens", size, "--work", str(tmp_path)]) == 2
    one_line_error(capsys.readouterr().err, "--tokens")
    assert not any(tmp_path.iterdir())


# --- bench_loop ------------------------------------------------------------------------------------------------------


class LoopRunStandIn:
    """train_jax.py as bench_loop sees it: its header names the devices it found (system.cpu_devices_per_process, as
    training/distributed/sharding.py sets them; tests/test_scale_out.py runs the real one), its run folder gets
    metrics and a summary (no interval with a rate when `rates` is false)."""

    runs: list[dict] = []
    rates = True

    def __init__(self, cmd: list[str], env: dict, **_) -> None:
        self.runs.append({**env, "cmd": cmd})
        found = next((re.match(r"system.cpu_devices_per_process=(\d+)$", a) for a in cmd if "cpu_devices" in a), None)
        run_dir = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("logging.run_dir=")))
        run_dir.mkdir(parents=True)
        ms = 12.5 if self.rates else float("nan")
        rows = [{"split": "train", "step": s, "ms_per_step": ms} for s in (1, 2)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "summary.json").write_text(json.dumps({"tokens_per_s_median": 1000.0 if self.rates else None}))
        self.header = f"devices    {found.group(1) if found else 1} x cpu in 1 process(es)\n"
        self.returncode = 0

    def communicate(self) -> tuple[str, str]:
        return self.header, ""


def test_bench_loop_warms_up_untimed_and_runs_on_the_devices_asked_for(monkeypatch, capsys):
    monkeypatch.setattr(subprocess, "Popen", LoopRunStandIn)
    monkeypatch.setattr(LoopRunStandIn, "runs", [])
    argv = ["--steps", "2", "--log-intervals", "1,2", "--devices-per-process", "2", "model=gpt2-tiny"]
    assert bench_loop.main(argv) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(LoopRunStandIn.runs) == 3 and "warm-up" in err  # one untimed run, then one per interval
    assert [x["log_interval"] for x in lines] == [1, 2] and all(x["devices"] == 2 for x in lines)
    flags = LoopRunStandIn.runs[0]["XLA_FLAGS"].split()
    assert "system.cpu_devices_per_process=2" in LoopRunStandIn.runs[0]["cmd"] and "device_count" not in " ".join(flags)
    assert all(f in flags for f in os.environ["XLA_FLAGS"].split() if "device_count" not in f)  # the others pass on


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--processes", "0"], ["--processes", ">= 1"]),
        (["--steps", "1"], ["--steps", ">= 2"]),
        (["--log-intervals", ","], ["--log-intervals", "no interval"]),
        (["--log-intervals", "1,x"], ["--log-intervals", "integer"]),
    ],
)
def test_bench_loop_refuses_bad_arguments(argv, words, monkeypatch, capsys):
    monkeypatch.setattr(subprocess, "Popen", LoopRunStandIn)
    monkeypatch.setattr(LoopRunStandIn, "runs", [])
    assert exit_code(bench_loop.main, argv) == 2
    one_line_error(capsys.readouterr().err, *words)
    assert LoopRunStandIn.runs == []


def test_bench_loop_says_so_when_no_interval_has_a_rate(monkeypatch, capsys):
    monkeypatch.setattr(subprocess, "Popen", LoopRunStandIn)
    monkeypatch.setattr(LoopRunStandIn, "rates", False)
    assert bench_loop.main(["--steps", "2", "--log-intervals", "5"]) == 1
    err = capsys.readouterr().err
    one_line_error(err.split("\n", 1)[1], "no log interval", "--steps")  # after the warm-up's note


# --- bench_checkpoint ------------------------------------------------------------------------------------------------


def test_bench_checkpoint_uses_the_runs_mesh_and_reports_the_first_save_apart(monkeypatch, capsys):
    """The run's mesh (system.mesh_model too); one untimed first save (it compiles the finiteness check), reported
    apart, then the `--saves` timed ones."""
    saved = []
    real = bench_checkpoint.Checkpointer.save
    spy = lambda self, *args, **kwargs: saved.append(1) or real(self, *args, **kwargs)  # noqa: E731
    monkeypatch.setattr(bench_checkpoint.Checkpointer, "save", spy)
    argv = ["--saves", "1", "--vocab", "259", "model=gpt2-tiny", "system.num_devices=2", "system.mesh_model=2"]
    assert bench_checkpoint.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["mesh"] == {"data": 1, "model": 2} and result["num_devices"] == 2
    assert len(saved) == 2 and result["saves"] == 1 and result["first_save"]["stall_ms"] > 0


@pytest.mark.parametrize(
    "argv, words",
    [(["--saves", "0"], ["--saves", ">= 1"]), (["--savez", "3"], ["config", "--savez"]), (["model=nope"], ["nope"])],
)
def test_bench_checkpoint_refuses_bad_arguments(argv, words, capsys):
    assert exit_code(bench_checkpoint.main, argv) == 2
    one_line_error(capsys.readouterr().err, *words)


# --- records ---------------------------------------------------------------------------------------------------------


def test_records_default_folder_is_the_checkouts_wherever_the_command_runs(tmp_path, monkeypatch, capsys):
    """A GPU benchmark run from another directory kept its record in ./benchmarks/results there, where no table read
    it; and records.py there found no folder. Both mean the checkout's benchmarks/results/, whose block BENCHMARKS.md
    holds."""
    checkout = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    monkeypatch.chdir(tmp_path)
    assert Path(records.destination(None, no_record=False, on_gpu=True)) == checkout
    assert records.destination(str(tmp_path / "mine"), no_record=False, on_gpu=True) == str(tmp_path / "mine")
    assert records.main([]) == 0
    assert capsys.readouterr().out == records.tables(records.read(checkout))
    assert not any(tmp_path.iterdir())  # nothing written where the command ran


def test_records_update_of_a_missing_file_is_one_line(tmp_path, capsys):
    assert records.main([str(tmp_path), "--update", str(tmp_path / "NOPE.md")]) == 2
    one_line_error(capsys.readouterr().err, "NOPE.md")


def test_records_end_marker_before_the_start_is_one_line(tmp_path, capsys):
    markdown = tmp_path / "B.md"
    markdown.write_text(f"a\n{records.END}\nb\n{records.START}\nc\n")
    assert records.main([str(tmp_path), "--update", str(markdown)]) == 1
    one_line_error(capsys.readouterr().err, str(markdown), "end marker")
    assert markdown.read_text() == f"a\n{records.END}\nb\n{records.START}\nc\n"


def test_records_a_json_that_is_not_a_record_is_named(tmp_path, capsys):
    records.write(tmp_path, "bench", "cpu", {"x": 1}, ["python"], "0")
    (tmp_path / "zz-settings.json").write_text('{"theme": "dark"}')
    assert records.main([str(tmp_path)]) == 1
    one_line_error(capsys.readouterr().err, "zz-settings.json", "not a benchmark record")
