"""Every tool in scripts/ runs once on the smallest config, as a script (`__main__`), in this process; the set-up
script reuses a Python that already has everything. (train_lm.sh and the piano scripts are full training runs;
bench_loop.py and bench_data.py time subprocess runs; launch_multihost.sh: test_scale_out.py; eval_harness.py:
test_harness.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT, communicate, script_in_process, spawn, tiny_overrides


def run_script(name: str, args: list[str], monkeypatch, capsys) -> str:
    """The script's output; its exit status must be 0."""
    result = script_in_process(name, args, monkeypatch, capsys)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_bench_times_the_step_the_loader_and_a_compile(data_cache, monkeypatch, capsys):
    tiny = tiny_overrides(data_cache)
    step = last_json(
        run_script("scripts.benchmarks.bench", ["--steps", "2", "--warmup", "1", *tiny], monkeypatch, capsys)
    )
    assert step["steps_timed"] == 2 and step["tokens_per_s"] > 0 and step["config"]["model"] == "gpt2-tiny"
    assert step["custom_calls"] == step["gemm_epilogues"] == {}  # the CPU's dots are XLA's own: no cuBLAS(Lt) call
    loader = last_json(run_script("scripts.benchmarks.bench", ["--loader", "--steps", "3", *tiny], monkeypatch, capsys))
    assert loader["steps"] == 3 and loader["tokens_per_batch"] == 8 * 64 and loader["loader_tokens_per_s"] > 0
    compiled = last_json(
        run_script("scripts.benchmarks.bench", ["--compile-only", "--vocab", "259", *tiny], monkeypatch, capsys)
    )
    assert compiled["model"] == "gpt2-tiny" and compiled["compile_s"] > 0


def test_bench_variants_share_a_process_and_each_is_kept_as_a_record(data_cache, tmp_path, monkeypatch, capsys):
    """Two configurations in one bench.py: a JSON line and a record each (their variant, every step's loss, XLA's
    memory plan), and the records' table lists both; system.xla_flags in a variant is one line (flags are per
    process)."""
    import jax

    from scripts.benchmarks import records

    args = ["--steps", "2", "--warmup", "2", "--record", str(tmp_path), *tiny_overrides(data_cache)]
    jax.config.update("jax_enable_compilation_cache", False)  # each configuration compiles, in its first step
    try:
        out = run_script(
            "scripts.benchmarks.bench", [*args, "--variant", "", "--variant", "train.batch_size=4"], monkeypatch, capsys
        )
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
    lines = [json.loads(line) for line in out.strip().splitlines()]
    assert [x["variant"] for x in lines] == ["", "train.batch_size=4"]
    assert all(0 < x["xla_compile_s"] < x["compile_s"] for x in lines), lines
    assert [x["config"]["global_batch"] for x in lines] == [8, 4]
    # the process's high-water marks are the first configuration's alone (a later one read the earlier's peak)
    assert lines[0]["peak_host_memory_bytes"] > 0 and lines[1]["peak_host_memory_bytes"] is None
    kept = records.read(tmp_path)
    assert [r["kind"] for r in kept] == ["bench", "bench"] and [r["result"] for r in kept] == lines
    for r in kept:
        assert len(r["result"]["losses"]) == 4 and r["result"]["planned_memory_bytes"] > 0
        assert r["device"] == "cpu" and r["command"].startswith("python -m scripts.benchmarks.bench --steps 2")
        assert r["xla_flags_env"] == os.environ["XLA_FLAGS"]  # the suite's (tests/conftest.py), as a user's would be
    table = records.tables(kept)
    assert "| (as set) |" in table and "| `train.batch_size=4` |" in table
    refused = script_in_process(
        "scripts.benchmarks.bench", [*args, "--variant", "system.xla_flags=['--xla_dump_to=x']"], monkeypatch, capsys
    )
    assert (
        refused.returncode == 2 and refused.stderr.count("\n") == 1 and "go with the common overrides" in refused.stderr
    )


def test_fp8_gemm_runs_every_form_and_each_rounds_as_fp8_does(monkeypatch, capsys):
    out = run_script(
        "scripts.benchmarks.fp8_gemm", ["--m", "64", "--k", "32", "--n", "48", "--iters", "2"], monkeypatch, capsys
    )
    lines = [json.loads(line) for line in out.strip().splitlines()]
    assert len(lines) == 9 and lines[0]["form"] == "fp8_dot forward and backward at runtime scales"
    *fp8, plain = lines[1:]
    assert plain["form"] == "bfloat16 product (no FP8)" and plain["relative_error"] < 0.005  # bf16's output rounding
    # e4m3's 3 mantissa bits on both operands: a few percent from the bf16 product, in every form alike
    assert all(0.01 < x["relative_error"] < 0.1 for x in fp8), fp8
    assert max(x["relative_error"] for x in fp8) - min(x["relative_error"] for x in fp8) < 0.005
    # the CPU has no FP8 GEMMs: no cuBLASLt call, and every dot of float8 operands widened first
    assert not any("f8" in c for x in lines for c in x["custom_calls"])
    assert [x["custom_calls"]["float8 dots"] for x in lines] == [0] * 9


def test_gemm_epilogue_runs_every_form_both_ways_and_each_computes_the_same_function(monkeypatch, capsys):
    small = ["--m", "128", "--k", "32", "--n", "48", "--context", "64", "--iters", "2"]
    out = run_script("scripts.benchmarks.gemm_epilogue", small, monkeypatch, capsys)
    lines = [json.loads(line) for line in out.strip().splitlines()]
    from scripts.benchmarks import gemm_epilogue

    forms = gemm_epilogue.forms(64)
    assert [(x["form"], x["passes"]) for x in lines] == [
        (form, passes) for form in forms for passes in ("forward", "forward and backward")
    ]
    # each form against its own function in float32: bfloat16's rounding of operands and output, nothing more
    assert all(x["relative_error"] < 0.01 for x in lines), lines
    assert not any(x["custom_calls"] or x["epilogues"] for x in lines)  # the CPU has no cuBLASLt
    # the train step's Linear and GELU compute the 2-D form's function, and that one the bias the product lacks
    rng = np.random.default_rng(0)
    x, w, b = (rng.normal(size=shape).astype(np.float32) for shape in ((128, 32), (32, 48), (48,)))
    (product, with_bias, gelu_2d, model) = (np.asarray(f(x, w, b)) for f in forms.values())
    np.testing.assert_allclose(model, gelu_2d, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(with_bias - product, np.broadcast_to(b, product.shape), rtol=1e-5, atol=1e-5)
    config = '"gemm_backend_config":{"epilogue":"BIAS_GELU_AUX","beta":0} ... "epilogue":"DEFAULT" "epilogue":"DEFAULT"'
    assert gemm_epilogue.epilogues(config) == {"BIAS_GELU_AUX": 1, "DEFAULT": 2}
    assert gemm_epilogue.main(["--m", "100", "--context", "64"]) == 2
    assert capsys.readouterr().err == "error: --context 64 must divide --m 100\n"


def test_gpu_suite_runs_its_stages_within_the_budget_and_packs_what_it_has(tmp_path, monkeypatch, capsys):
    """The suite's machinery on a CPU: a stage runs as a command with its log, one whose usual length the budget no
    longer holds is skipped and says so, and the output folder is packed (the data's caches left out)."""
    import tarfile

    out = tmp_path / "suite"
    data = "dataset.tokenizer=byte dataset.max_documents=24 dataset.num_proc=1"
    args = ["--out", str(out), "--only", "data,levers", "--budget", "45", "--model", "gpt2-tiny", "--batch", "8"]
    run_script("scripts.benchmarks.gpu_suite", [*args, "--data", data], monkeypatch, capsys)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["exit"] for r in summary["data"]["runs"]] == [0]
    assert "usually takes 60 s" in summary["levers"]["runs"][0]["skipped"]  # 45 s cannot hold the levers' 60
    assert not {"environment", "newcomer", "tests"} & summary.keys()  # not asked for
    loader = json.loads((out / "logs" / "data.log").read_text().strip().splitlines()[-1])
    assert loader["model"] == "gpt2-tiny" and loader["tokens_per_batch"] == 8 * 64
    with tarfile.open(out.with_suffix(".tar.gz")) as tar:
        names = tar.getnames()
    assert "suite/summary.json" in names and "suite/logs/data.log" in names
    assert not any("/cache" in n for n in names)
    # a second call into the same folder (a GPU session's second device call) adds to the summary: it replaced it
    again_args = [*args[:2], "--only", "levers", "--budget", "1", "--data", data]
    run_script("scripts.benchmarks.gpu_suite", again_args, monkeypatch, capsys)
    again = json.loads((out / "summary.json").read_text())
    assert again["data"]["runs"][0] == summary["data"]["runs"][0] and len(again["levers"]["runs"]) == 2


def test_gpu_suites_levers_stage_runs_the_levers_asked_for_and_a_wrong_pick_is_one_line(tmp_path):
    from scripts.benchmarks import gpu_suite

    assert gpu_suite.chosen_levers(None) == gpu_suite.LEVERS
    picked = gpu_suite.chosen_levers("vocab,accum,nothing like it")
    assert picked == ["", "model.vocab_multiple=1", "train.batch_size=8 train.grad_accum_steps=4"]
    out = tmp_path / "suite"
    with pytest.raises(SystemExit) as e:
        gpu_suite.main(["--out", str(out), "--only", "levers", "--levers", "vocabulary"])
    assert str(e.value).startswith("error: --levers vocabulary: no lever holds any of these; the levers: ")
    assert "\n" not in str(e.value) and not out.exists()  # said before anything was written
    with pytest.raises(SystemExit) as e:  # a misspelt stage: it ran the data stage alone and reported success
        gpu_suite.main(["--out", str(out), "--only", "lever,,tests"])
    assert str(e.value) == f"error: --only: no stage lever; the stages: {', '.join(gpu_suite.ALL_STAGES)}"
    assert not out.exists()


def test_benchmarks_records_block_is_the_table_of_the_records_kept():
    """BENCHMARKS.md's GPU records table is written from benchmarks/results/ (records.py --update), not by hand."""
    from scripts.benchmarks import records

    text = (ROOT / "BENCHMARKS.md").read_text()
    block = text.split(records.START, 1)[1].split(records.END, 1)[0]
    assert records.RESULTS == ROOT / "benchmarks" / "results"  # the checkout's, wherever the command runs
    assert block == "\n" + records.tables(records.read(records.RESULTS))
    assert records.read(records.RESULTS)  # the block is not empty by having no records


def test_bench_decode_times_both_decoders(monkeypatch, capsys):
    result = last_json(
        run_script(
            "scripts.benchmarks.bench_decode",
            ["--new-tokens", "8", "--vocab", "259", "model=gpt2-tiny"],
            monkeypatch,
            capsys,
        )
    )
    assert result["new_tokens"] == 8 and result["kv_cache"]["tokens_per_s"] > 0 and result["no_cache"]["seconds"] > 0
    assert result["new_tokens_past_context"] == 0
    # past gpt2-tiny's 64 positions the cached decoder decodes without its cache: said, and in the result
    args = ["--prompt-len", "60", "--new-tokens", "8", "--vocab", "259", "model=gpt2-tiny"]
    result = script_in_process("scripts.benchmarks.bench_decode", args, monkeypatch, capsys)
    assert result.returncode == 0 and last_json(result.stdout)["new_tokens_past_context"] == 4
    assert "bench_decode: 4 of the 8 new tokens are past model.context_size=64" in result.stderr


def test_bench_checkpoint_times_saves(monkeypatch, capsys):
    result = last_json(
        run_script(
            "scripts.benchmarks.bench_checkpoint",
            ["--saves", "2", "--vocab", "259", "model=gpt2-tiny", "system.num_devices=1"],
            monkeypatch,
            capsys,
        )
    )
    assert result["saves"] == 2 and result["state_bytes"] > 0 and result["commit_s_median"] >= 0


def test_state_memory_lists_every_layout(monkeypatch, capsys):
    result = last_json(
        run_script(
            "scripts.tools.state_memory",
            ["--devices", "8", "--vocab", "259", "model=gpt2-tiny", "model.n_head=4"],
            monkeypatch,
            capsys,
        )
    )
    assert [(row["data"], row["model"]) for row in result["layouts"]] == [(8, 1), (4, 2), (2, 4)]
    assert all(row["fsdp_bytes_per_device"] <= row["dp_bytes_per_device"] for row in result["layouts"])
    # the state a run makes: the statistics' buffers (two parameter-sized copies of the gradients) counted too
    args = ["--devices", "1", "--vocab", "259", "model=gpt2-tiny"]
    plain = last_json(run_script("scripts.tools.state_memory", args, monkeypatch, capsys))
    stats = ["logging.store_last_grads=true", "logging.store_past_grads=true"]
    more = last_json(run_script("scripts.tools.state_memory", [*args, *stats], monkeypatch, capsys))
    grads = 2 * 4 * plain["params"]  # float32
    assert more["layouts"][0]["dp_bytes_per_device"] - plain["layouts"][0]["dp_bytes_per_device"] >= grads


def test_sample_and_export_take_the_checkpoint_named_by_which(finished, tmp_path, monkeypatch, capsys):
    from safetensors.numpy import load_file

    from training.checkpoints.trained import load_trained

    out = run_script(
        "scripts.tools.sample",
        [str(finished), "--which", "4", "--prompt", "def ", "--max-new-tokens", "5"],
        monkeypatch,
        capsys,
    )
    assert out.startswith("# gpt2-tiny, step 4,")
    run_script("scripts.tools.export_hf", [str(finished), str(tmp_path / "hf"), "--which", "4"], monkeypatch, capsys)
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))["transformer.wte.weight"]
    for step in (4, 8):  # step 4's weights, not the latest's
        wte = np.asarray(load_trained(str(finished), str(step)).model.wte)[: exported.shape[0]]
        assert np.array_equal(exported, wte) == (step == 4)


def test_sample_refuses_a_note_models_flags_for_a_text_model(finished, monkeypatch, capsys):
    """A missing --prompt-midi file, a --task or an --out were ignored without a word, and a text sample printed."""
    args = [str(finished), "--prompt-midi", "missing.mid", "--task", "dynamics", "--max-new-tokens", "2"]
    result = script_in_process("scripts.tools.sample", args, monkeypatch, capsys)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"error: --prompt-midi/--task: {finished} is a text model (byte tokenizer); leave them out\n"
    )


def test_the_tools_read_a_checkpoint_saved_under_earlier_keys_as_a_resume_does(finished, tmp_path):
    """A checkpoint whose metadata holds an earlier spelling (model.arch=gpt2; an absolute lr floor, min_lr) loads in
    sample, evaluate and export (`load_trained`) as it does for a resume: in today's keys, the same weights."""
    from training.checkpoints.trained import load_trained

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    metadata = run_dir / "checkpoints" / "8" / "meta" / "metadata"
    meta = json.loads(metadata.read_text())
    lr_config = meta["config"]["optimizer"]["lr_config"]
    ratio = lr_config.pop("min_lr_ratio")
    lr_config["min_lr"] = ratio * lr_config["lr"]
    assert meta["config"]["model"]["arch"] == "gpt"
    meta["config"]["model"]["arch"] = "gpt2"
    metadata.write_text(json.dumps(meta))

    earlier, today = load_trained(str(run_dir), "8"), load_trained(str(finished), "8")
    assert earlier.cfg.model.arch == "gpt"
    assert earlier.cfg.optimizer.lr_config.min_lr_ratio == pytest.approx(ratio)
    np.testing.assert_array_equal(np.asarray(earlier.model.wte), np.asarray(today.model.wte))


def test_the_tools_read_a_checkpoint_trained_with_cudnns_attention_where_it_does_not_run(finished, tmp_path):
    """model.attention=cudnn, as a GPU run saves it: sample, evaluate and export refused it on the CPU ("use
    model.attention=auto"), with no flag to say so. The kernel is not the weights: auto's kernel reads them here."""
    from training.checkpoints.trained import load_trained

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    metadata = run_dir / "checkpoints" / "8" / "meta" / "metadata"
    meta = json.loads(metadata.read_text())
    meta["config"]["model"]["attention"] = "cudnn"
    metadata.write_text(json.dumps(meta))

    trained = load_trained(str(run_dir), "8")
    assert trained.model.cfg.attention == "blocked"  # auto's choice on the CPU
    np.testing.assert_array_equal(np.asarray(trained.model.wte), np.asarray(load_trained(str(finished), "8").model.wte))


def test_check_env_names_what_is_missing_in_one_line_and_exits_1(monkeypatch, capsys):
    """A package whose module cannot be found (even with its distribution's metadata still there), and a missing
    test extra: listed without --test, required with it."""
    import check_env

    monkeypatch.setitem(check_env.REQUIRED, "jax", "jax_is_gone")
    monkeypatch.setitem(check_env.TEST_EXTRAS, "no-such-extra", "no_such_extra.sub")
    assert check_env.main([]) == 1
    out, err = capsys.readouterr()
    assert "no-such-extra not installed (the test extra: source activate_env.sh test)" in out
    assert err.splitlines() == [
        "error: missing packages: jax (ImportError: No module named 'jax_is_gone'). Run `source activate_env.sh`"
    ]
    assert check_env.main(["--test"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: missing packages: jax (ImportError: No module named 'jax_is_gone'); no-such-extra "
        "(ModuleNotFoundError: No module named 'no_such_extra'). Run `source activate_env.sh test`"
    ]
    assert check_env.main(["--tests"]) == 2  # a misspelt flag ran the plain check
    assert capsys.readouterr().err == "error: check_env.py takes --test or nothing; got --tests\n"
    assert check_env.main(["--help"]) == 0  # it was refused as an unknown flag
    assert capsys.readouterr().out.startswith("Print the versions, backend and devices")


def test_check_env_names_a_backend_that_cannot_start_in_one_line(monkeypatch, capsys):
    """JAX_PLATFORMS=cuda where jaxlib is the CPU build: JAX's bare AssertionError was a traceback, in the script run
    to diagnose exactly that."""
    import jax

    import check_env

    def cannot_start():
        raise AssertionError()

    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    monkeypatch.setattr(jax, "devices", cannot_start)
    assert check_env.main([]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: JAX could not start its backend (JAX_PLATFORMS=cuda): AssertionError: no reason given. For a GPU, "
        "JAX's CUDA build: rm -rf .venv && source activate_env.sh (it detects the GPU), or pip install -e '.[gpu]'"
    ]


def test_check_env_warns_in_one_line_of_versions_outside_pyprojects_ranges(monkeypatch, capsys):
    """A Python used as it is (a GPU image's) may hold other versions than the lock: those outside pyproject.toml's
    ranges are named on one warning line; a pre-release or local build inside a range is not. Exit 0 either way."""
    import check_env

    assert check_env.main(["--test"]) == 0 and "warning" not in capsys.readouterr().err  # this .venv: the lock
    installed = check_env.version
    faked = {"jax": "0.9.0", "optax": "0.2.9.dev20261101+cuda", "chex": "0.1.92rc1", "optuna": "3.6.1"}
    monkeypatch.setattr(check_env, "version", lambda name: faked.get(name) or installed(name))
    assert check_env.main([]) == 0
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")] == [
        "warning: outside pyproject.toml's ranges: jax 0.9.0 (wants <0.11,>=0.10.2); optuna 3.6.1 (wants <3,>=2.10.1)."
        " The tested versions are requirements*.txt's (source activate_env.sh installs them)"
    ]
    # an installed copy (`pip install .`) has no pyproject.toml beside it: the ranges are read from its metadata
    monkeypatch.setattr(check_env, "PYPROJECT", check_env.PYPROJECT.parent / "no-such-pyproject.toml")
    assert check_env.main([]) == 0
    assert "jax 0.9.0 (wants <0.11,>=0.10.2); optuna 3.6.1 (wants <3,>=2.10.1)" in capsys.readouterr().err


def test_check_env_warns_in_one_line_when_a_gpu_is_here_but_jax_runs_on_the_cpu(tmp_path, monkeypatch, capsys):
    """An `nvidia-smi` on PATH that lists a GPU (a stand-in printing what the real one prints) while JAX's backend
    is the CPU: one warning line on stderr saying how to get the CUDA build; exit 0. Without it, no warning."""
    import check_env

    assert check_env.main([]) == 0 and "warning" not in capsys.readouterr().err  # no nvidia-smi on this machine
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0a1b2c3d)"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert check_env.main([]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "warning: 1 NVIDIA GPU(s) here (GPU 0: NVIDIA H100 80GB HBM3) but JAX runs on the CPU: install JAX's CUDA build"
        " (rm -rf .venv && source activate_env.sh, which detects the GPU; or pip install -e '.[gpu]')"
    ]


ENV_FILES = ("activate_env.sh", "pyproject.toml", "requirements.txt", "requirements-test.txt", "requirements-eval.txt")


# A package hidden from a Python: the first finder on its meta path refuses it (importlib.util.find_spec included).
HIDE = """import sys


class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "{hidden}":
            raise ModuleNotFoundError(f"{{name}} is hidden")


sys.meta_path.insert(0, Hide())
"""


def _activate(tmp_path, which: str, env: dict) -> subprocess.CompletedProcess:
    for name in ENV_FILES:
        shutil.copy(ROOT / name, tmp_path / name)
    proc = spawn(
        [
            "bash",
            "-c",
            f'source activate_env.sh {which} && echo "PYTHONPATH=$PYTHONPATH" && '
            'python -c "import training, models; print(training.__name__, models.__name__)"',
        ],
        cwd=tmp_path,
        env={"PYTHON": sys.executable, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return communicate(proc, timeout=120)


@pytest.mark.parametrize("how", ["moved", "python gone"])
def test_activate_env_makes_a_stale_venv_anew(how, tmp_path):
    """A .venv names its folder in `activate` and its scripts: moved with its checkout, sourcing it put a folder that
    no longer exists on PATH and `python` was whatever came next (rc 0, then `No module named 'jax'`). One whose
    Python was removed said only `No such file or directory`. Both are said and made anew (here the interpreter
    that would make it, PYTHON=false, refuses: nothing is installed)."""
    made = tmp_path / "made"
    made.mkdir()
    for name in ENV_FILES:
        shutil.copy(ROOT / name, made / name)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(made / ".venv")], check=True)
    here = made
    if how == "moved":
        here = tmp_path / "moved"
        made.rename(here)
    else:
        (made / ".venv" / "bin" / "python").unlink()
        (made / ".venv" / "bin" / "python").symlink_to(tmp_path / "no-such-python")
    # Every Python this test could reach refuses to run: the stale .venv's, as sourced, fell through to the next
    # `python` on PATH, the suite's own, and installed the copied checkout into it.
    refuse = tmp_path / "refuse"
    refuse.mkdir()
    for name in ("python", "python3"):
        (refuse / name).write_text('#!/bin/sh\necho refused: python "$@" >&2\nexit 97\n')
        (refuse / name).chmod(0o755)
    before = sorted(str(p.relative_to(here)) for p in (here / ".venv").rglob("*"))
    proc = spawn(
        ["bash", "-c", 'source activate_env.sh; echo "rc=$? VIRTUAL_ENV=$VIRTUAL_ENV"'],
        cwd=here,
        env={"PYTHON": "false", "PYTHONPATH": None, "VIRTUAL_ENV": None, "PATH": f"{refuse}:/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result = communicate(proc, timeout=60)
    assert result.stdout.splitlines() == ["rc=1 VIRTUAL_ENV="]  # not the old place's environment
    assert result.stderr.splitlines() == [
        f"activate_env: {here}/.venv was made elsewhere (a moved or copied checkout), or its Python is gone or older "
        "than 3.11; making it anew",
        "activate_env: false does not run as Python; the project needs 3.11 or newer: set PYTHON to one (e.g. "
        "PYTHON=python3.11 source activate_env.sh)",
    ]
    assert sorted(str(p.relative_to(here)) for p in (here / ".venv").rglob("*")) == before  # PYTHON=false: untouched


def test_the_installed_project_imports_beside_folders_named_like_its_packages(tmp_path):
    """`python -m train_jax dataset.files=[data/*.jsonl]` (docs/data.md) from a folder holding data/: setuptools'
    default editable install finds the packages only after the path, so the folder was taken for the package
    (`cannot import name 'Data' from 'data'`); activate_env.sh installs with the checkout itself on the path."""
    for name in ("data", "models", "core", "training"):
        (tmp_path / name).mkdir()
    (tmp_path / "data" / "a.jsonl").write_text('{"text": "hi"}\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as installed, in a fresh interpreter
    command = [sys.executable, "-m", "train_jax", "dataset=json_files", "dataset.files=[data/*.jsonl]", "--cfg", "job"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "- data/*.jsonl" in result.stdout, result.stderr[-2000:]


def test_activate_env_refuses_a_python_older_than_3_11_in_one_line_and_makes_nothing(tmp_path):
    """PYTHON (or python3) of Python 3.10, Ubuntu 22.04's: pip's `No matching distribution found for jaxlib`, and the
    .venv it left kept 3.10 when PYTHON then named 3.11."""
    for name in ENV_FILES:
        shutil.copy(ROOT / name, tmp_path / name)
    old = tmp_path / "python3.10"
    old.write_text('#!/bin/sh\ncase "$2" in *python_version*) echo 3.10.13;; *) exit 1;; esac\n')
    old.chmod(0o755)
    proc = spawn(
        ["bash", "-c", 'source activate_env.sh; echo "rc=$?"'],
        cwd=tmp_path,
        env={"PYTHON": str(old), "PYTHONPATH": None, "VIRTUAL_ENV": None},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result = communicate(proc, timeout=60)
    assert result.stdout.splitlines() == ["rc=1"]
    assert result.stderr.splitlines() == [
        f"activate_env: {old} is Python 3.10.13; the project needs 3.11 or newer: set PYTHON to one (e.g. "
        "PYTHON=python3.11 source activate_env.sh)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*ENV_FILES, "python3.10"])  # no .venv


def test_activate_env_puts_the_python_it_uses_first_on_path_as_python(tmp_path):
    """PYTHON=<a Python with every package> whose folder's `python` is another interpreter (/usr/bin/python3.12
    beside a /usr/bin/python of another version): the scripts' `python` was that other one."""
    for name in ENV_FILES:
        shutil.copy(ROOT / name, tmp_path / name)
    other = tmp_path / "bin"
    other.mkdir()
    (other / "python3.99").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # that Python, by another name
    (other / "python3.99").chmod(0o755)
    (other / "python").write_text("#!/bin/sh\necho another python >&2\nexit 97\n")
    (other / "python").chmod(0o755)
    proc = spawn(
        ["bash", "-c", 'source activate_env.sh && python -c "import sys, training; print(sys.executable)"'],
        cwd=tmp_path,
        env={"PYTHON": str(other / "python3.99"), "PYTHONPATH": None, "VIRTUAL_ENV": None},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result = communicate(proc, timeout=120)
    assert result.returncode == 0, result.stderr
    assert os.path.realpath(result.stdout.strip()) == os.path.realpath(sys.executable)
    (link,) = (tmp_path / ".python-bin").glob("*/python")  # a folder per interpreter
    assert os.path.realpath(link) == str(other / "python3.99")


@pytest.mark.parametrize("which,hidden", [("", "torch"), ("test", None)], ids=["training without torch", "test"])
def test_activate_env_uses_a_python_that_already_has_everything(which, hidden, tmp_path):
    """No .venv and a Python that has every package of the set (a GPU image, say): activate_env.sh uses it as it
    is: it installs nothing (the project is already installed in it), creates nothing and sets no PYTHONPATH, and
    the project's packages import. Training's set asks for neither torch nor the test tools (here hidden from that
    Python: neither found nor importable)."""
    env = {"PYTHONPATH": None}  # the project imports as installed, not from a path the tests set
    if hidden:
        (tmp_path / "hide").mkdir()
        (tmp_path / "hide" / "sitecustomize.py").write_text(HIDE.format(hidden=hidden))
        env["PYTHONPATH"] = str(tmp_path / "hide")
    result = _activate(tmp_path, which, env)
    assert result.returncode == 0, result.stderr
    python = sys.executable
    assert result.stderr.splitlines() == [
        f"activate_env: using {python} (it has every package of the set; nothing installed)",
        # the checkout it was installed from is not this copy's: said, not changed
        f"activate_env: its gpt-jax is installed from {ROOT}, not this checkout: outside this folder the project "
        f"imports from there ({python} -m pip install --no-deps --no-build-isolation --config-settings "
        f"editable_mode=compat -e {tmp_path} switches)",
    ]
    assert result.stdout.split() == [f"PYTHONPATH={env['PYTHONPATH'] or ''}", "training", "models"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "hide") == sorted(ENV_FILES)  # no .venv


def test_test_gpu_sh_without_a_gpu_says_so_in_one_line_and_runs_no_test(tmp_path):
    """`bash scripts/test_gpu.sh` where JAX sees no GPU: check_env.py's report, then one line naming the whole suite's
    command, exit 2, and no pytest run (nothing created beside the copied files)."""
    for name in (*ENV_FILES, "check_env.py", "scripts/test_gpu.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    python = os.path.dirname(sys.executable)
    env = {"PYTHON": sys.executable, "PATH": f"{python}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": None}
    proc = spawn(
        ["bash", "scripts/test_gpu.sh"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result = communicate(proc, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "backend       cpu" in result.stdout and "passed" not in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: JAX sees no GPU here (python check_env.py names its backend); the whole suite: bash scripts/test.sh"
    ]
    assert sorted(str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*") if f.is_file()) == sorted(
        [*ENV_FILES, "check_env.py", "scripts/test_gpu.sh"]
    )


@pytest.mark.parametrize(
    "module, args, line",
    [  # each gave a traceback (an empty prompt list, a division by zero, Hydra's own) or ran with the value ignored
        ("scripts.tools.sample", ["/no/run", "--num-samples", "0"], "argument --num-samples: must be >= 1; got 0"),
        ("scripts.tools.hessian", ["/no/run", "--iters", "0"], "argument --iters: must be >= 1; got 0"),
        ("scripts.benchmarks.bench_decode", ["--new-tokens", "0"], "argument --new-tokens: must be >= 1; got 0"),
        ("scripts.benchmarks.bench_decode", ["model=gpt2-nope"], "error: config: model=gpt2-nope does not exist"),
        ("scripts.tools.state_memory", ["--devices", "0"], "argument --devices: must be >= 1; got 0"),
        # statistics' "no median for empty data" / a ZeroDivisionError after the build and compile
        ("scripts.benchmarks.bench", ["--steps", "0"], "argument --steps: must be >= 1; got 0"),
        # 0 ran one warm-up step anyway (the first compiles): 4 losses for 3 timed steps, unsaid
        ("scripts.benchmarks.bench", ["--warmup", "0"], "argument --warmup: must be >= 1; got 0"),
        # a ZeroDivisionError (`--m % --context`), statistics' "no median for empty data"
        ("scripts.benchmarks.gemm_epilogue", ["--context", "0"], "argument --context: must be >= 1; got 0"),
        ("scripts.benchmarks.fp8_gemm", ["--iters", "0"], "argument --iters: must be >= 1; got 0"),
        # one configuration, no record: the variant and the record went unread
        ("scripts.benchmarks.bench", ["--compile-only", "--variant", "x=1"], "--compile-only measures the common"),
        ("scripts.benchmarks.bench", ["--loader", "--record", "d"], "--loader measures the common overrides once"),
        ("scripts.tools.profile_summary", ["/no/run", "--top", "-2"], "argument --top: must be >= 0; got -2"),
        ("scripts.experiments.coord_check", ["--lr", "0"], "argument --lr: must be > 0; got 0"),
        ("scripts.tools.landscape", ["/no/run", "--span", "0", "0"], "--span LO HI: LO must be below HI; got 0 0"),
        ("scripts.tools.state_memory", ["--bogus"], "error: unrecognized arguments: --bogus"),
        # lm-eval's islice traceback after the model loaded; "no docs"; a result labelled -1 shots
        ("scripts.tools.eval_harness", ["/no/run", "--limit", "0"], "argument --limit: must be > 0; got 0"),
        ("scripts.tools.eval_harness", ["/no/run", "--num-fewshot", "-1"], "argument --num-fewshot: must be >= 0"),
        ("scripts.tools.eval_harness", ["/no/run", "--batch-tokens", "0"], "argument --batch-tokens: must be >= 1"),
        ("scripts.tools.export_hf", ["/no/run", "out", "--architecture", "gpt3"], "argument --architecture: invalid"),
        # an OverflowError traceback from JAX's key (2**63), or another seed's numbers (2**32 + 5 is 5's)
        ("scripts.tools.sample", ["/no/run", "--seed", str(2**63)], "argument --seed: must be below 2**32"),
        ("scripts.tools.landscape", ["/no/run", "--seed", "-1"], "argument --seed: must be >= 0; got -1"),
        ("scripts.tools.compare_runs", [], "error: the following arguments are required: paths"),
    ],
)
def test_a_tools_bad_argument_is_a_usage_error_naming_it(module, args, line, monkeypatch, capsys):
    """In one line, as every other error (argparse's own printed its usage first)."""
    result = script_in_process(module, args, monkeypatch, capsys)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert line in result.stderr and result.stderr.count("\n") == 1, result.stderr


FOLDER_FLAGS = [  # (tool, its arguments before the folder flag, the flag): each writes under a folder it names
    ("scripts.benchmarks.bench", ["--steps", "1"], "--record"),
    ("scripts.benchmarks.bench_peer", ["--nanogpt", "{nanogpt}", "--device", "cpu"], "--record"),
    ("scripts.benchmarks.gpu_suite", [], "--out"),
    ("scripts.benchmarks.soak_kill_resume", [], "--workdir"),
    ("scripts.experiments.time_to_target", ["--out", "{tmp}/ttt"], "--record"),
    ("scripts.experiments.time_to_target", [], "--out"),
    ("scripts.experiments.optimizer_leaderboard", ["--only", "adamw"], "--out"),
    ("scripts.experiments.optimizer_leaderboard", [], "--summarize"),
    ("scripts.experiments.schedule_search", [], "--out"),
]


@pytest.mark.parametrize("tool,args,flag", FOLDER_FLAGS, ids=[f"{t.split('.')[-1]}{f}" for t, _, f in FOLDER_FLAGS])
def test_a_folder_flag_with_a_file_in_the_way_is_one_line_before_anything_runs(
    tool, args, flag, tmp_path, monkeypatch, capsys
):
    """A file where a tool's output folder would go was mkdir's traceback, some after the measuring or the runs."""
    (tmp_path / "nanogpt").mkdir()
    (tmp_path / "nanogpt" / "model.py").write_text("")  # bench_peer asks only that the checkout looks like one
    (tmp_path / "a-file").write_text("mine")
    given = [a.format(tmp=tmp_path, nanogpt=tmp_path / "nanogpt") for a in args]
    result = script_in_process(tool, [*given, flag, str(tmp_path / "a-file" / "below")], monkeypatch, capsys)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        f"error: {flag}: {tmp_path / 'a-file' / 'below'}: {tmp_path / 'a-file'} is a file, not a directory; "
        "choose a directory"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "nanogpt"] and not result.stdout


def test_bench_refuses_a_run_of_several_stages_in_one_line(data_cache, monkeypatch, capsys):
    """Its steps would mix the stages' batch sizes and windows, and its tokens per second one stage's batch."""
    stages = "train.stages=[{until: 0.5, batch_size: 4}, {until: 1.0}]"
    args = ["--steps", "2", *tiny_overrides(data_cache, stages)]
    result = script_in_process("scripts.benchmarks.bench", args, monkeypatch, capsys)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: config: train.stages: bench.py times one step's configuration; set train.batch_size and "
        "model.attention_window to the stage to time, and train.stages=[]"
    ], result.stderr
    assert not result.stdout
