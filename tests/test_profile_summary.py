"""scripts/tools/profile_summary.py: a run's trace of steps a..b as a table of where a step's time goes, by category."""

import contextlib
import gzip
import io
import json
import subprocess
import sys

import pytest

from helpers import communicate, run_cli, spawn, tiny_overrides
from scripts.tools import profile_hlo, profile_summary

FIRST, LAST = 3, 5


# Two train_jax commands in one fresh process: the other train step, then the profiled run.
TWO_RUNS = "import json, sys, train_jax; sys.exit(max(train_jax.command_line(a) for a in json.loads(sys.argv[1])))"


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory, data_cache):
    """The module's one traced run: steps 3..5 of the tiny config."""
    # The profiled step as the suite meets it: compiled by another process into the compilation cache, and loaded
    # from there under a program id the trace's HLO does not list, beside another train step this process compiled
    # (the summary must find the program's HLO by its instructions, not take any program of the same name). The
    # profiled process is a fresh one: a trace holds the HLO of every program its process has compiled, which in a
    # test worker's own process is hundreds (the summary took 26 s there, against 1 s).
    first = tmp_path_factory.mktemp("unprofiled") / "run"
    done = run_cli(
        tiny_overrides(
            data_cache,
            f"logging.run_dir={first}",
            "train.max_steps=2",
            "checkpoint.save=false",
            "logging.tensorboard=false",
        )
    )
    assert done.returncode == 0, done.stderr[-2000:]
    other = tmp_path_factory.mktemp("other") / "run"
    run_dir = tmp_path_factory.mktemp("profiled") / "run"
    runs = [
        tiny_overrides(
            data_cache,
            f"logging.run_dir={other}",
            "train.max_steps=2",
            "train.batch_size=4",
            "checkpoint.save=false",
            "logging.tensorboard=false",
        ),
        tiny_overrides(
            data_cache,
            f"logging.run_dir={run_dir}",
            f"train.max_steps={LAST}",
            "train.eval_interval=100",
            f"system.profile_steps=[{FIRST},{LAST}]",
            "checkpoint.save=false",
            "logging.tensorboard=false",
        ),
    ]
    command = [sys.executable, "-c", TWO_RUNS, json.dumps(runs)]
    both = communicate(spawn(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), timeout=300)
    assert both.returncode == 0, both.stderr[-2000:]
    assert (other / "metrics.jsonl").exists()
    return run_dir


@pytest.fixture(scope="module")
def summary(profiled_run) -> dict:
    """The script's `--json --top 5` output for the traced run (its `main`, in this process), once for the module."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert profile_summary.main([str(profiled_run), "--json", "--top", "5"]) == 0
    return json.loads(out.getvalue())


def rows(s: dict) -> dict[str, dict]:
    return {row["category"]: row for row in s["rows"]}


def trace_window_and_op_time(run_dir) -> tuple[float, float]:
    """From the Perfetto file, read here independently of the script: the steps' window (the first train_step call to
    the end of the last train-step op) and the time in it when at least one train-step op runs, in ms."""
    (perfetto,) = (run_dir / "profile").glob("plugins/profile/*/perfetto_trace.json.gz")
    events = [e for e in json.load(gzip.open(perfetto))["traceEvents"] if e.get("ph") == "X"]
    ops = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("args", {}).get("hlo_module") == "jit_train_step"
    )
    end = max(b for _, b in ops)
    start = min(e["ts"] for e in events if e["name"] == "PjitFunction(train_step)")
    busy, reached = 0.0, start
    for a, b in ops:  # the union of the ops' intervals
        busy += max(0.0, b - max(a, reached))
        reached = max(reached, b)
    return (end - start) / 1000, busy / 1000


def test_the_rows_split_the_traced_steps_time(profiled_run, summary):
    assert summary["steps"] == LAST - FIRST + 1
    assert summary["ops_with_hlo"] == summary["ops"] > 0  # every op found in the HLO the trace stores
    window = summary["window_ms"]
    assert sum(r["ms"] for r in summary["rows"]) == pytest.approx(window, abs=0.01)
    assert summary["step_ms"] * summary["steps"] == pytest.approx(window, abs=0.01)
    assert sum(r["share"] for r in summary["rows"]) == pytest.approx(100, abs=0.05)
    window_ms, op_ms = trace_window_and_op_time(profiled_run)
    assert window == pytest.approx(window_ms, rel=0.01)
    categorised = window - rows(summary)["host_gaps"]["ms"]
    assert 0.95 * op_ms <= categorised <= 1.005 * op_ms + 0.01  # the categories cover the ops' time, and only that


def test_other_programs_in_the_window_are_named(profiled_run, monkeypatch):
    """An evaluation between traced train steps (system.profile_steps across train.eval_interval): its ops fall in
    the window and are counted in the rows, which a note now says (they were counted as the train step's without a
    word). Here the trace's own ops, with one program's op of 40% of the window added between two steps."""
    read = profile_summary.read_ops

    def with_an_evaluation(xplane):
        ops, calls = read(xplane)
        step = [op for op in ops if op.module == profile_summary.MODULE]
        start, end = min(op.start for op in step), max(op.end for op in step)
        middle = (start + end) / 2
        half = 0.2 * (end - start)
        eval_op = step[0]._replace(start=middle - half, end=middle + half, module="jit_eval_step", program=None)
        return [*ops, eval_op], calls

    monkeypatch.setattr(profile_summary, "read_ops", with_an_evaluation)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert profile_summary.main([str(profiled_run), "--json"]) == 0
    notes = json.loads(out.getvalue())["notes"]
    (note,) = [n for n in notes if n.startswith("the traced steps' window also holds other programs' ops")]
    assert "jit_eval_step" in note and "system.profile_steps" in note


def test_the_named_scopes_get_their_own_rows(summary):
    by_category = rows(summary)
    for category in ("attention", "lm_head_loss", "optimizer", "matmul", "elementwise", "casts_copies"):
        assert by_category[category]["ms"] > 0 and by_category[category]["ops"] > 0, category
    assert by_category["collectives"]["ops"] == 0  # one device
    assert not summary["notes"]


def test_the_table_and_the_most_expensive_ops(profiled_run, summary, capsys):
    assert profile_summary.main([str(profiled_run), "--top", "3"]) == 0
    table = capsys.readouterr().out
    assert "| category | ms | ms/step | % of step | ops |" in table and "| total |" in table
    assert f"{LAST - FIRST + 1} steps of jit_train_step" in table
    assert all(f"| {label} |" in table for label in profile_summary.CATEGORIES.values())
    top_table = table.split("| op | category | ms/step | % of step | runs | scope path |")[1]
    assert len([line for line in top_table.splitlines() if line.startswith("| ")]) == 3
    top = summary["top"]
    assert len(top) == 5 and [e["ms"] for e in top] == sorted((e["ms"] for e in top), reverse=True)
    assert {e["category"] for e in top} <= set(profile_summary.CATEGORIES)


def test_a_program_loaded_from_the_cache_gets_the_hlo_holding_all_its_ops():
    """Ops of program 3, which the trace's HLO does not list, and of program 4, which it lists for another program:
    the HLO of the same module holding every op name they ran (program 2, the smallest such), never one missing some
    (program 1) nor another module's."""

    class Op:
        def __init__(self, module, program, hlo_op):
            self.module, self.program, self.hlo_op = module, program, hlo_op

    hlo = {
        ("jit_train_step", 1): {"fusion.1": 1, "fusion.2": 1},
        ("jit_train_step", 2): {"fusion.1": 2, "fusion.7": 2},
        ("jit_train_step", 4): {"fusion.1": 4, "fusion.7": 4, "fusion.9": 4},
        ("jit_eval_step", 5): {"fusion.1": 5, "fusion.7": 5},
    }
    ops = [
        Op("jit_train_step", 3, "fusion.1"),
        Op("jit_train_step", 3, "fusion.7"),
        Op("jit_train_step", 1, "fusion.2"),
        Op("jit_train_step", 6, "fusion.8"),
        Op("jit_train_step", 5, "fusion.7"),
    ]
    hlo[("jit_train_step", 5)] = {"fusion.1": 5}  # a program of this process under the id the loaded one carries
    programs = profile_summary.hlo_of_programs(hlo, ops)
    assert programs[("jit_train_step", 3)] is hlo[("jit_train_step", 2)]
    assert programs[("jit_train_step", 5)] is hlo[("jit_train_step", 2)]
    assert programs[("jit_train_step", 1)] is hlo[("jit_train_step", 1)]  # listed: its own
    assert ("jit_train_step", 6) not in programs  # no program holds fusion.8


def test_a_run_without_a_profile_is_one_line_and_exit_2(tmp_path, capsys):
    assert profile_summary.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert str(tmp_path) in err and "system.profile_steps" in err


def op(start, end, kernel, hlo_op=None, line="stream"):
    return profile_summary.Op(
        start,
        end,
        ("/device:GPU:0", line),
        ("/device:GPU:0", 0),
        hlo_op or kernel,
        profile_summary.MODULE,
        1,
        None,
        kernel,
        "",
    )


def test_kernels_overlapping_on_one_stream_share_the_overlap_and_leave_no_gap():
    """A CUDA graph's kernels on one stream can overlap by a little (b starts before a ends and outlasts it): both
    ran, so the overlap is split between them; neither is cut short and nothing is counted as a host gap. A kernel
    inside another (a CPU while-loop's body inside its thunk) still takes its parent's time while it runs."""
    share, idle = profile_summary.attribute([op(0, 10, "a"), op(8, 20, "b")], 0, 20)
    assert idle == 0 and share == {0: 9, 1: 11}
    share, idle = profile_summary.attribute([op(0, 10, "loop"), op(2, 6, "body"), op(12, 14, "c")], 0, 14)
    assert share == {0: 6, 1: 4, 2: 2} and idle == 2


HLO = """HloModule jit_train_step, entry_computation_layout={()->f32[]}

%fused_computation.4 (param_0.1: f32[768], param_1.2: f32[]) -> f32[768] {
  %param_0.1 = f32[768]{0} parameter(0)
  %param_1.2 = f32[] parameter(1)
  %broadcast.3 = f32[768]{0} broadcast(f32[] %param_1.2), dimensions={}
  ROOT %multiply.7 = f32[768]{0} multiply(f32[768]{0} %param_0.1, f32[768]{0} %broadcast.3), metadata={op_name="jit(train_step)/optimizer/mul"}
}

ENTRY %main.9 (p0: f32[768], p1: f32[], p2: bf16[8,768], p3: bf16[768,768]) -> (f32[768], bf16[8,768]) {
  %p0 = f32[768]{0} parameter(0)
  %p1 = f32[] parameter(1)
  %p2 = bf16[8,768]{1,0} parameter(2)
  %p3 = bf16[768,768]{1,0} parameter(3)
  %loop_multiply_fusion.4 = f32[768]{0} fusion(f32[768]{0} %p0, f32[] %p1), kind=kLoop, calls=%fused_computation.4
  %custom-call.12 = (bf16[8,768]{1,0}, s8[0]{0}) custom-call(bf16[8,768]{1,0} %p2, bf16[768,768]{1,0} %p3), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/jvp(lm_head_loss)/dot_general"}
  %get-tuple-element.1 = bf16[8,768]{1,0} get-tuple-element((bf16[8,768]{1,0}, s8[0]{0}) %custom-call.12), index=0
  ROOT %tuple.2 = (f32[768]{0}, bf16[8,768]{1,0}) tuple(f32[768]{0} %loop_multiply_fusion.4, bf16[8,768]{1,0} %get-tuple-element.1)
}
"""  # noqa: E501 (XLA's lines, as it writes them)


def test_an_optimised_hlo_dump_names_a_gpus_kernels_and_their_scopes():
    """XLA's GPU kernels are named after the optimised program's instructions (`loop_multiply_fusion.4` runs as
    `loop_multiply_fusion_4`); the dump gives each its scope path and its fused body's opcodes, and a library call
    its target: the table's rows then follow the named scopes, as on a CPU."""
    hlo = {profile_hlo.kernel_key(k): v for k, v in profile_hlo.text_instructions(HLO).items()}
    path, opcodes, targets = hlo["loop_multiply_fusion_4"]
    assert path == "jit(train_step)/optimizer/mul" and {"multiply", "broadcast"} <= opcodes
    assert profile_summary.classify(path, opcodes, "loop_multiply_fusion_4") == "optimizer"
    path, opcodes, targets = hlo["custom_call_12"]
    assert targets == "__cublas$lt$matmul" and "lm_head_loss" in path
    assert profile_summary.classify(path, opcodes, targets) == "lm_head_loss"
    # without a dump, a kernel of a CUDA graph is classified by its own name
    assert (
        profile_summary.classify("", {"nvjet", "sm90", "tst"}, "nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT") == "matmul"
    )
    sdpa = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"
    assert profile_summary.classify("", {"cudnn", "generated"}, sdpa) == "attention"
    assert profile_summary._name(op(0, 1, "loop_add_fusion_3", "command_buffer_1")) == "loop_add_fusion_3"
