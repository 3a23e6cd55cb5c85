"""Reliability under faults and bad input, through the command line in real processes (and, for the other cases of
a kind of bad input, `train_jax.command_line` in the test's process).

Every expected failure ends with exactly one line on stderr (no traceback, no library output), a non-zero exit, the
key or file named, and whatever existed before left byte for byte as it was.
"""

import http.server
import json
import shutil
import signal
import socket
import sys
import threading
import time

import pytest

from helpers import read_metrics, run_cli, run_command, start, tiny_overrides, wait_for_step

pytestmark = pytest.mark.e2e


def one_line(result) -> str:
    """The single non-empty line the project wrote on stderr."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


def failed_in_one_line(result) -> str:
    assert result.returncode != 0, result.stdout[-2000:]
    return one_line(result)


def file_bytes(root) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def truncate(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


@pytest.fixture(autouse=True)
def _token_store_built(finished):
    """The token store exists before any test runs: building it shows a progress bar on stderr (after 2 s)."""


def copy_of(run_dir, where):
    shutil.copytree(run_dir, where)
    return where


# -- 3. a damaged latest checkpoint ------------------------------------------------------------------------------


def test_a_damaged_latest_checkpoint_names_the_newest_that_restores_and_auto_falls_back_to_it(
    finished, data_cache, tmp_path
):
    corrupt = copy_of(finished, tmp_path / "corrupt")
    for data_file in (corrupt / "checkpoints" / "8" / "opt_state").rglob("ocdbt.process_0/d/*"):
        truncate(data_file)
    missing = copy_of(finished, tmp_path / "missing")
    shutil.rmtree(missing / "checkpoints" / "8" / "opt_state")
    for run_dir, what in ((corrupt, "its opt_state does not restore"), (missing, "its opt_state is missing")):
        before = file_bytes(run_dir)
        result = run_cli(
            tiny_overrides(data_cache, "checkpoint.load=True", f"checkpoint.load_path={run_dir}"), timeout=120
        )
        line = failed_in_one_line(result)
        assert line.startswith(f"error: checkpoint {run_dir}/checkpoints/8: {what}"), line
        assert "the newest checkpoint that restores is step 4: resume it with checkpoint.load_file=4" in line
        assert file_bytes(run_dir) == before

    before = file_bytes(corrupt / "checkpoints")
    result = run_cli(tiny_overrides(data_cache, f"logging.run_dir={corrupt}", "checkpoint.load=auto"), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    warning = one_line(result)
    assert (
        warning.startswith("warning: checkpoint")
        and "resuming from step 4, the newest checkpoint that restores" in warning
    )
    assert f"resuming {corrupt}/checkpoints at step 4" in result.stdout
    assert max(r["step"] for r in read_metrics(corrupt, "train")) == 8
    after = file_bytes(corrupt / "checkpoints")
    aside = [p for p in (corrupt / "checkpoints").iterdir() if p.name.startswith("8.damaged-")]
    assert len(aside) == 1  # the damaged step is kept, renamed, and step 8 written again
    assert all(
        after[aside[0].relative_to(corrupt / "checkpoints") / p.relative_to("8")] == data
        for p, data in before.items()
        if p.parts[0] == "8"
    )
    assert all(after[p] == data for p, data in before.items() if p.parts[0] == "4")


# -- 1. paths a user gets wrong --------------------------------------------------------------------------------------


def _without_root_override() -> None:
    """In the child: drop CAP_DAC_OVERRIDE, so that a directory's mode binds even when the tests run as root."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(24, 1, 0, 0, 0)  # PR_CAPBSET_DROP, CAP_DAC_OVERRIDE


def _file_size_limit(limit: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


PATH_CASES = [  # (override, key named, reason, limits set in the child, in a process of its own)
    ("checkpoint.save_path={d}/a_file", "checkpoint.save_path", "{d}/a_file is a file, not a directory", None, True),
    ("logging.run_dir={d}/a_file/run", "logging.run_dir", "{d}/a_file is a file, not a directory", None, False),
    ("dataset.cache_dir={d}/a_file/cache", "dataset.cache_dir", "{d}/a_file is a file, not a directory", None, False),
    (  # a FileExistsError traceback from mkdir
        "system.compilation_cache_dir={d}/a_file",
        "system.compilation_cache_dir",
        "{d}/a_file is a file, not a directory",
        None,
        False,
    ),
    (
        "logging.run_dir={d}/read_only/run",
        "logging.run_dir",
        "cannot write in {d}/read_only: Permission denied",
        _without_root_override,
        True,
    ),
    (  # a cache not there yet is made: where it cannot be, one line before anything is built
        "dataset.cache_dir={d}/read_only/cache",
        "dataset.cache_dir",
        "cannot write in {d}/read_only: Permission denied",
        _without_root_override,
        True,
    ),
    (
        "logging.run_dir={d}/run",
        "logging.run_dir",
        "cannot write in {d}: File too large (disk full?)",
        _file_size_limit(4096),
        True,
    ),
]


@pytest.mark.parametrize(
    "override,key,reason,child,own_process",
    PATH_CASES,
    ids=[
        "save_path a file",
        "run_dir under a file",
        "cache_dir under a file",
        "compile cache a file",
        "read-only",
        "cache read-only",
        "full",
    ],
)
def test_a_path_that_cannot_be_written_is_one_line_naming_the_key_and_nothing_is_written(
    override, key, reason, child, own_process, data_cache, tmp_path, capsys
):
    (tmp_path / "a_file").write_text("mine\n")
    (tmp_path / "read_only").mkdir(mode=0o555)
    args = tiny_overrides(data_cache, f"logging.run_dir={tmp_path}/run", override.format(d=tmp_path))
    result = run_command(args, capsys, own_process, timeout=60, preexec_fn=child)
    line = failed_in_one_line(result)
    assert line.startswith(f"error: {key}: ") and reason.format(d=tmp_path) in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "read_only"]
    assert (tmp_path / "a_file").read_text() == "mine\n" and not any((tmp_path / "read_only").iterdir())


# -- 4. override syntax ------------------------------------------------------------------------------------------

ARGUMENTS = [("train.batch_size=[1,", True), ("dataset.files=[a b", False), ('logging.name="unterminated', False)]


@pytest.mark.parametrize("argument,own_process", ARGUMENTS, ids=[a for a, _ in ARGUMENTS])
def test_an_argument_hydra_cannot_parse_is_named_with_how_to_quote_it(argument, own_process, tmp_path, capsys):
    args = [argument, f"logging.run_dir={tmp_path}/run"]
    result = run_command(args, capsys, own_process, timeout=60)
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith(f"error: config: cannot parse the argument {argument!r} (")
    assert "'train.batch_size=[1,2]'" in line and "quote" in line
    assert not (tmp_path / "run").exists()


# -- 2. data files a user gets wrong ---------------------------------------------------------------------------------


def _qa_rows(n=40):
    return [{"question": f"what is {i}? " * 8, "answer": f"it is {i}. " * 8} for i in range(n)]


def _write_jsonl(path, rows, replace=None):
    lines = [json.dumps(r) for r in rows]
    for number, text in (replace or {}).items():
        lines[number - 1] = text
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))  # \udcXX: the raw byte XX
    return path


JSON_CASES = [  # (how the file is broken, the columns asked for, what the line says, in a process of its own)
    (
        {18: '{"question": "broken'},
        ("question", "answer"),
        "{f} line 18: not valid JSON (column 14: Unterminated",
        True,
    ),  # datasets' own output would show there
    (
        {6: '{"question": "no answer here"}'},
        ("question", "answer"),
        "dataset.completion_column: 'answer' is missing or null in {f} line 6",
        False,
    ),
    ({}, ("quest", "answer"), "dataset.prompt_column: 'quest' is not a column of {f}; it has question, answer", False),
    (  # a Latin-1 byte: pyarrow read it, and a traceback came from decoding the column
        {12: '{"question": "caf\udce9", "answer": "it is"}'},
        ("question", "answer"),
        "{f} line 12: not UTF-8 (byte 17: invalid continuation byte)",
        False,
    ),
    (  # numbers, not text: a traceback from the tokenizer
        {n: json.dumps({"question": f"what is {n}?", "answer": n}) for n in range(1, 41)},
        ("question", "answer"),
        "dataset.completion_column: 'answer' of {f} holds int64, not text; its text columns: question",
        False,
    ),
]


@pytest.mark.parametrize(
    "broken,columns,message,own_process",
    JSON_CASES,
    ids=["malformed line", "record without completion", "no such column", "not UTF-8", "numbers"],
)
def test_a_bad_json_lines_file_is_one_line_naming_the_file_and_line(
    broken, columns, message, own_process, data_cache, tmp_path, capsys
):
    data = _write_jsonl(tmp_path / "qa.jsonl", _qa_rows(), broken)
    before = data.read_bytes()
    args = tiny_overrides(
        data_cache,
        f"logging.run_dir={tmp_path}/run",
        "dataset=json_files",
        f"dataset.files=[{data}]",
        f"dataset.prompt_column={columns[0]}",
        f"dataset.completion_column={columns[1]}",
        "loss_masking=finetuning",
        "dataset.tokenizer=byte",
    )
    result = run_command(args, capsys, own_process, timeout=120)
    line = failed_in_one_line(result)
    assert message.format(f=data) in line, line
    assert data.read_bytes() == before


def _midi_folder(root, composers=("bach", "mozart"), pieces=3):
    import numpy as np

    from data.midi import write_midi
    from data.notes import Notes

    rng = np.random.default_rng(0)
    for composer in composers:
        for i in range(pieces):
            start = np.cumsum(rng.uniform(0.05, 0.3, 160))
            write_midi(
                Notes.from_lists(
                    rng.integers(40, 80, 160).tolist(),
                    rng.integers(30, 100, 160).tolist(),
                    start.tolist(),
                    (start + 0.2).tolist(),
                ),
                root / composer / f"piece{i}.mid",
            )
    return root


def test_an_unreadable_midi_file_is_skipped_with_a_warning_and_none_readable_is_one_line(data_cache, tmp_path):
    songs = _midi_folder(tmp_path / "midi")
    (songs / "bach" / "damaged.mid").write_bytes((songs / "bach" / "piece0.mid").read_bytes()[:40])
    notes = (
        "dataset=midi_files",
        "dataset.tokenizer=notes",
        "data.notes_per_record=32",
        "train.max_steps=2",
        "train.eval_interval=2",
    )
    result = run_cli(
        tiny_overrides(data_cache, f"logging.run_dir={tmp_path}/run", *notes, f"dataset.files=[{songs}]"), timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert one_line(result) == (
        f"warning: dataset.files: {songs}/bach/damaged.mid: not a readable MIDI file (EOFError); skipped"
    )

    (tmp_path / "junk" / "bach").mkdir(parents=True)
    (tmp_path / "junk" / "bach" / "a.mid").write_bytes(b"not a MIDI file")
    result = run_cli(
        tiny_overrides(data_cache, f"logging.run_dir={tmp_path}/run2", *notes, f"dataset.files=[{tmp_path / 'junk'}]"),
        timeout=120,
    )
    line = failed_in_one_line(result)
    assert line.startswith(
        f"error: dataset.files: none of the 1 MIDI files gives notes; {tmp_path}/junk/bach/a.mid: "
        "not a readable MIDI file"
    )
    assert not (tmp_path / "run2").exists()


# -- 5. wandb online without a server that takes the key; 9. secrets stay secret -------------------------------------


class _RefusingWandbServer(http.server.BaseHTTPRequestHandler):
    """A wandb server that refuses every key (401 on its API, 404 elsewhere)."""

    def do_POST(self):
        if self.path.rstrip("/") != "/graphql":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"errors": [{"message": "user is not logged in"}]}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing_wandb():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusingWandbServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


API_KEY = "0123456789abcdef" * 2 + "fedcba98"  # 40 characters, like a real key
HF_TOKEN = "hf_" + "s3cr3tT0k3n" * 3


def test_a_wandb_that_cannot_be_imported_is_one_line_and_trains_nothing(data_cache, tmp_path, monkeypatch, capsys):
    """wandb present but one of its own packages missing (seen on a machine whose image lacked platformdirs)."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    overrides = tiny_overrides(data_cache, f"logging.run_dir={tmp_path}/run", "logging.wandb=offline")
    result = run_command(overrides, capsys, own_process=False)
    assert result.returncode == 2
    line = failed_in_one_line(result)
    assert line.startswith("error: logging.wandb=offline: wandb cannot be imported ("), line
    assert line.endswith("or use logging.wandb=disabled"), line
    assert not read_metrics(tmp_path / "run", "train")


def test_wandb_online_without_a_server_that_takes_the_key_stops_within_60_s_in_one_line(
    refusing_wandb, data_cache, tmp_path
):
    for server, why in (
        (f"http://127.0.0.1:{_closed_port()}", "cannot reach the wandb server at"),
        (refusing_wandb, "refused: user is not logged in"),
    ):
        started = time.time()
        result = run_cli(
            tiny_overrides(data_cache, f"logging.run_dir={tmp_path}/run", "logging.wandb=online"),
            timeout=120,
            env={"WANDB_API_KEY": API_KEY, "WANDB_BASE_URL": server},
        )
        assert time.time() - started < 60
        line = failed_in_one_line(result)
        assert line.startswith("error: logging.wandb=online: ") and server in line and why in line, line
        assert "logging.wandb_fallback=offline" in line
        assert not read_metrics(tmp_path / "run", "train")  # nothing trained


def test_secrets_are_written_nowhere_and_an_unreachable_wandb_falls_back_to_offline(
    refusing_wandb, data_cache, tmp_path
):
    run_dir = tmp_path / "run"
    result = run_cli(
        tiny_overrides(
            data_cache, f"logging.run_dir={run_dir}", "logging.wandb=online", "logging.wandb_fallback=offline"
        ),
        timeout=180,
        env={"WANDB_API_KEY": API_KEY, "HF_TOKEN": HF_TOKEN, "WANDB_BASE_URL": refusing_wandb},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warning = one_line(result)
    assert warning.startswith("warning: logging.wandb=online: the wandb server at") and "logging offline" in warning
    assert "wandb sync" in warning
    offline = list((run_dir / "wandb").glob("offline-run-*/*.wandb"))
    assert len(offline) == 1 and max(r["step"] for r in read_metrics(run_dir, "train")) == 8
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert run_dir / "config.yaml" in files and run_dir / "checkpoints" / "8" / "meta" / "metadata" in files
    for secret in (API_KEY, HF_TOKEN):
        assert secret not in result.stdout + result.stderr
        assert [p for p in files if secret.encode() in p.read_bytes()] == []


# -- 7. two runs resuming one checkpoint directory at once -----------------------------------------------------------


def test_a_second_run_on_a_checkpoint_directory_in_use_is_refused_and_the_lock_dies_with_its_holder(
    finished, data_cache, tmp_path
):
    run_dir = copy_of(finished, tmp_path / "run")
    resume = tiny_overrides(data_cache, "checkpoint.load=True", f"checkpoint.load_path={run_dir}")
    # Longer runs on the finished run's lr schedule (8 steps, then its floor): the compiled steps come from the cache.
    longer = ["checkpoint.overwrite_config=True", "optimizer.lr_config.max_steps=8"]
    first = start(resume + [*longer, "train.max_steps=100000", "train.eval_interval=50000"])
    try:
        wait_for_step(run_dir, 9, first)
        first.send_signal(signal.SIGSTOP)  # alive, holding the lock, and leaving both cores to the second
        saved = file_bytes(run_dir / "checkpoints")
        second = run_cli(resume, timeout=120)  # a requeued copy of the same job
        line = failed_in_one_line(second)
        assert line == (
            f"error: checkpoint.save_path: {run_dir}/checkpoints is in use by another run (pid "
            f"{first.pid} on host {socket.gethostname()}, since " + line.split(", since ")[1]
        )
        assert "let it finish or stop it" in line and "step " not in second.stdout
        assert file_bytes(run_dir / "checkpoints") == saved  # the second wrote nothing there
    finally:
        first.kill()  # kill -9: no handler runs, the lock is not released by the holder
        first.communicate()
    third = run_cli(resume + [*longer, "train.max_steps=10"], timeout=180)
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"resuming {run_dir}/checkpoints at step 8" in third.stdout


# -- 8. the disk fills during a save ---------------------------------------------------------------------------------


def test_a_save_that_fills_the_disk_stops_in_one_line_keeps_the_last_checkpoint_and_resumes_later(
    finished, data_cache, tmp_path
):
    run_dir = copy_of(finished, tmp_path / "run")
    saved = file_bytes(run_dir / "checkpoints")
    # Steps 9-12 with the same lr schedule (so the compiled steps come from the cache and nothing else grows), under
    # a file-size limit that the run's logs fit in and the step-12 checkpoint's array files do not.
    longer = tiny_overrides(
        data_cache,
        f"logging.run_dir={run_dir}",
        "checkpoint.load=auto",
        "checkpoint.overwrite_config=True",
        "train.max_steps=12",
        "optimizer.lr_config.max_steps=8",
    )
    result = run_cli(longer, timeout=180, preexec_fn=_file_size_limit(100_000))
    line = failed_in_one_line(result)
    assert line == (
        f"error: checkpoint.save_path: saving step 12 to {run_dir}/checkpoints failed: File too large (disk "
        "full?); the last complete one, step 8, is intact. Free some space and rerun with "
        "checkpoint.load=auto to resume"
    ), line
    after = file_bytes(run_dir / "checkpoints")
    assert {p: after[p] for p in saved if p.parts[0] in ("4", "8")} == {
        p: b for p, b in saved.items() if p.parts[0] in ("4", "8")
    }
    assert not (run_dir / "checkpoints" / "12").exists()

    result = run_cli(longer, timeout=180)  # the space is back
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming {run_dir}/checkpoints at step 8" in result.stdout and (run_dir / "checkpoints" / "12").is_dir()


# -- 6. a process of a multi-process run dies ------------------------------------------------------------------------


def _start_processes(n: int, args: list[str], port: int) -> list:
    import subprocess
    import sys

    from helpers import ROOT, spawn, xla_flags_without_device_count

    # devices come from cpu_devices_per_process, not the suite's XLA_FLAGS
    return [
        spawn(
            [
                sys.executable,
                str(ROOT / "train_jax.py"),
                *args,
                f"system.num_processes={n}",
                f"system.process_id={i}",
                f"system.coordinator_address=127.0.0.1:{port}",
            ],
            env={"XLA_FLAGS": xla_flags_without_device_count()},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]


@pytest.mark.soak
def test_a_killed_process_ends_the_survivor_in_one_line_and_the_run_resumes_with_all_processes(data_cache, tmp_path):
    run_dir, timeout_s = tmp_path / "run", 10
    args = tiny_overrides(
        data_cache,
        f"logging.run_dir={run_dir}",
        "train.max_steps=20",
        "train.eval_interval=100",
        "checkpoint.save_steps=4",
        "train.batch_size=4",
        "system.num_devices=null",
        "system.cpu_devices_per_process=1",
        f"system.distributed_timeout_s={timeout_s}",
        "checkpoint.load=auto",
    )
    survivor, victim = _start_processes(2, args, _closed_port())
    try:
        wait_for_step(run_dir, 10, survivor, timeout=240)
        victim.kill()  # kill -9
        killed = time.time()
        _, err = survivor.communicate(timeout=timeout_s + 60)
        assert time.time() - killed < timeout_s + 15
    finally:
        for proc in (survivor, victim):
            proc.kill()
            proc.communicate()
    assert survivor.returncode != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [
        f"error: system: lost process 1 of 2: no sign of life for {timeout_s} s "
        "(system.distributed_timeout_s); resume with all 2 processes and checkpoint.load=auto"
    ], err[-3000:]

    # Saves at 4 and 8 were due before the kill at step 10; the one at 8 is asynchronous and needs both processes,
    # so it may not have committed when the victim died: the run resumes from the newest committed checkpoint.
    last = max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    resumed = _start_processes(2, args, _closed_port())  # the same command, with both processes
    try:
        outputs = [proc.communicate(timeout=240) for proc in resumed]
    finally:
        for proc in resumed:
            proc.kill()
    assert [proc.returncode for proc in resumed] == [0, 0], outputs[0][1][-3000:]
    assert last in (4, 8) and f"resuming {run_dir}/checkpoints at step {last}" in outputs[0][0]
    assert max(r["step"] for r in read_metrics(run_dir, "train")) == 20
