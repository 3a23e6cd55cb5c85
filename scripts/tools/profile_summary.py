"""Where a train step's time goes: a run's jax.profiler trace (`system.profile_steps=[a,b]`) as a table by category.

    python -m scripts.tools.profile_summary RUN_DIR            # Markdown: ms, ms/step, % of step and ops per category
    python -m scripts.tools.profile_summary RUN_DIR --top 15   # and the 15 most expensive ops, with their category
    python -m scripts.tools.profile_summary RUN_DIR --json     # the same as one JSON object

Reads the newest trace in RUN_DIR/profile (training/loop/profile.py). The ops are the trace's events with an `hlo_op`
stat: kernels on the GPU planes' `Stream` lines, or, on XLA:CPU, thunks on the host threads of `/host:CPU`. Each is
looked up in the HLO module the trace stores (`/host:metadata`) and classified by its named-scope path first
(`attention` in models/block.py, `lm_head_loss`, `optimizer`), then by its HLO opcodes (those of a fusion's body
included) or kernel name. Collectives go first: communication stays visible whatever scope issued it. The steps'
window runs from the first `PjitFunction(train_step)` call to the end of the last train-step op; each instant of it is
split evenly among the ops running then (CPU threads and GPU streams overlap; a CPU while-loop's thunk yields to the
body ops inside it), so the rows add up to the window, and instants with no op running are host gaps. Several devices:
their mean.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

from core.arguments import OneLineParser, at_least
from scripts.tools.profile_hlo import hlo_instructions, kernel_key, optimized_hlo
from training.config import layout

MODULE, CALL = "jit_train_step", "PjitFunction(train_step)"
CATEGORIES = {
    "matmul": "weight matmuls (qkv, attention output, MLP)",
    "attention": "attention (scores, softmax, values)",
    "lm_head_loss": "LM head and loss over the vocabulary",
    "elementwise": "norms, GELU, other elementwise",
    "optimizer": "optimizer update",
    "casts_copies": "casts and copies",
    "collectives": "collectives",
    "host_gaps": "host gaps (no op running: the device waits for the host)",
}
SCOPES = ("attention", "lm_head_loss", "optimizer")
COLLECTIVE = re.compile(
    r"all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|collective-broadcast|nccl", re.I
)
GEMM = re.compile(r"gemm|cublas|cutlass|xmma|nvjet|matmul", re.I)  # GPU GEMM kernels and custom-call targets
FUSED_ATTENTION = re.compile(r"cudnn|fmha|flash|sdpa|compute_dot_do_o", re.I)  # cuDNN's attention kernels
MOVEMENT = {
    "convert",
    "copy",
    "copy-start",
    "copy-done",
    "transpose",
    "reshape",
    "broadcast",
    "slice",
    "dynamic-slice",
    "dynamic-update-slice",
    "concatenate",
    "pad",
    "reverse",
    "bitcast-convert",
}
STRUCTURAL = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "fusion"}


class Op(NamedTuple):
    start: float
    end: float
    line: tuple  # (plane, line): ops on one line run one at a time (or nest)
    device: tuple  # (plane, device ordinal)
    hlo_op: str
    module: str
    program: int | None
    run: int | None  # one execution of the module (XLA:CPU's thunks have it)
    kernel: str
    path: str  # the named-scope path from the event's own stats (GPU annotations), when it has one


def classify(path: str, opcodes: set[str], names: str) -> str:
    """The op's category: collectives, then the named scope in its path, then what kind of op it is."""
    if COLLECTIVE.search(" ".join(opcodes) + " " + names):
        return "collectives"
    for scope in SCOPES:
        if re.search(rf"(^|[/(]){scope}([/)]|$)", path):
            return scope
    if ("custom-call" in opcodes or not opcodes & {"dot", "fusion"}) and FUSED_ATTENTION.search(names):
        return "attention"  # cuDNN's fused attention (its custom call, or its kernels by name): no convolutions here
    if opcodes & {"dot", "convolution"} or GEMM.search(names):
        return "matmul"
    if (opcodes - STRUCTURAL and opcodes - STRUCTURAL <= MOVEMENT) or re.search(r"memcpy|memset", names, re.I):
        return "casts_copies"
    return "elementwise"


def read_ops(xplane: Path) -> tuple[list[Op], list[tuple[float, float]]]:
    """The ops (device planes' streams if the trace has any, else the host's XLA:CPU threads) and the host's calls of
    the train step."""
    from jax.profiler import ProfileData

    device_ops, host_ops, calls = [], [], []
    for plane in ProfileData.from_file(str(xplane)).planes:
        on_device = plane.name.startswith("/device:")
        lines = list(plane.lines)
        if on_device:  # a GPU's streams; a TPU has one "XLA Ops" line. The other lines (XLA Modules, Steps) derive.
            lines = [ln for ln in lines if ln.name.startswith("Stream")] or [ln for ln in lines if ln.name == "XLA Ops"]
        for line in lines:
            for event in line.events:
                if event.name == CALL:
                    calls.append((event.start_ns, event.end_ns))
                stats = dict(event.stats)
                if "hlo_op" not in stats and not on_device:
                    continue  # a device's memcpys have none, but keep it busy
                path = str(stats.get("op_name") or stats.get("name") or stats.get("tf_op") or "")
                program = stats.get("program_id")
                (device_ops if on_device else host_ops).append(
                    Op(
                        event.start_ns,
                        event.end_ns,
                        (plane.name, line.name),
                        (plane.name, stats.get("device_ordinal", 0)),
                        str(stats.get("hlo_op", event.name)),
                        str(stats.get("hlo_module", "")),
                        None if program is None else int(program),
                        stats.get("run_id"),
                        event.name,
                        path,
                    )
                )
    calls.sort()
    outermost = [c for i, c in enumerate(calls) if not any(o[0] <= c[0] and c[1] <= o[1] for o in calls[:i])]
    return device_ops or host_ops, outermost


def attribute(ops: list[Op], start: float, end: float) -> tuple[dict[int, float], float]:
    """Wall time of [start, end] per op (index), each instant split evenly among the ops running then (on each line
    only the innermost), and the time no op was running."""
    segments, by_line = [], defaultdict(list)
    for i, op in enumerate(ops):
        by_line[op.line].append(i)
    for indices in by_line.values():
        stack: list[list] = []  # [op index, end, where its own time resumes]
        for i in sorted(indices, key=lambda i: (ops[i].start, -ops[i].end)):
            # an op inside the one before it (a while-loop's body on a CPU thread) nests; one that outlasts it (two
            # kernels of a CUDA graph overlapping on one stream) does not: both run, the overlap split between them
            while stack and (stack[-1][1] <= ops[i].start or stack[-1][1] < ops[i].end):
                _close(stack, segments)
            op_end = ops[i].end
            if stack:
                segments.append((stack[-1][2], ops[i].start, stack[-1][0]))
                op_end = min(op_end, stack[-1][1])
            stack.append([i, op_end, ops[i].start])
        while stack:
            _close(stack, segments)
    points = sorted(
        p for a, b, i in segments if min(b, end) > max(a, start) for p in ((max(a, start), 1, i), (min(b, end), -1, i))
    )
    share, active, idle, previous = defaultdict(float), Counter(), 0.0, start
    for t, delta, i in points:
        if t > previous:
            for j in active:
                share[j] += (t - previous) / len(active)
            idle += 0.0 if active else t - previous
        previous = t
        active[i] += delta
        if not active[i]:
            del active[i]
    return share, idle + max(end - previous, 0.0)


def _close(stack: list[list], segments: list) -> None:
    i, end, resume = stack.pop()
    segments.append((resume, end, i))
    if stack:
        stack[-1][2] = end


def hlo_of_programs(hlo: dict, ops: list) -> dict:
    """The HLO of each program the ops ran: the one the trace lists under its (module, program id) when that holds
    every op name the program ran; else the program of the same module name that does, fusion numbers included (the
    same program, compiled before). An executable loaded from the persistent compilation cache runs under the program
    id of the process that compiled it, which this trace may not list, or may list for another program of this
    process. A program with no such match gets no HLO (its ops are classified by their names)."""
    ran: dict[tuple, set[str]] = {}
    for op in ops:
        ran.setdefault((op.module, op.program), set()).add(op.hlo_op)
    programs = {}
    for (module, program), names in ran.items():
        own = hlo.get((module, program))
        if own is not None and names <= own.keys():
            programs[module, program] = own
            continue
        matches = [insts for (m, _), insts in hlo.items() if m == module and names <= insts.keys()]
        if matches:  # several: the same program compiled again, or one that holds more; the smallest is the closest
            programs[module, program] = min(matches, key=len)
    return programs


def summarize(xplane: Path, top: int = 0, optimized: dict | None = None) -> dict:
    """The table's rows (and the `top` most expensive ops) for the trace of one run's steps. `optimized`: the step's
    optimised HLO by kernel name (`optimized_hlo`), where a GPU's kernels are looked up first: the trace's own HLO is
    the program before XLA's passes, which names no fusion, and kernels of a CUDA graph carry the graph's name."""
    optimized = optimized or {}
    hlo = hlo_instructions(xplane.read_bytes())
    ops, calls = read_ops(xplane)
    step_ops = [op for op in ops if op.module == MODULE]
    if not step_ops:
        raise LookupError(f"the trace {xplane} has no op of {MODULE}")
    end = max(op.end for op in step_ops)
    calls = [c for c in calls if c[0] <= end]
    start = min([c[0] for c in calls] + [op.start for op in step_ops])
    steps = len(calls) or len({op.run for op in step_ops} - {None}) or 1
    ops = [op for op in ops if op.end > start and op.start < end]
    programs = hlo_of_programs(hlo, ops)
    categories, paths, looked_up = [], [], 0
    for op in ops:
        insts = programs.get((op.module, op.program), {})
        found = (
            optimized.get(kernel_key(op.kernel)) or optimized.get(kernel_key(op.hlo_op))
            if op.module == MODULE
            else None
        )
        path, opcodes, targets = found or insts.get(op.hlo_op, ("", set(), ""))
        looked_up += bool(found) or op.hlo_op in insts
        if not opcodes:  # no HLO for it: the op's name says what it is (XLA names fusions after their ops)
            opcodes = set(re.split(r"[_.]", re.sub(r"\.\d+$", "", _name(op))))
        path = path or op.path
        paths.append(path)
        categories.append(classify(path, opcodes, f"{op.kernel} {targets}"))
    devices = sorted({op.device for op in ops})
    rows = {c: {"ms": 0.0, "ops": 0} for c in CATEGORIES}
    per_op: dict[str, dict] = {}
    for device in devices:
        mine = [i for i, op in enumerate(ops) if op.device == device]
        share, idle = attribute([ops[i] for i in mine], start, end)
        rows["host_gaps"]["ms"] += idle / 1e6 / len(devices)
        for k, i in enumerate(mine):
            ms = share.get(k, 0.0) / 1e6 / len(devices)
            rows[categories[i]]["ms"] += ms
            rows[categories[i]]["ops"] += 1
            name = _name(ops[i])
            entry = per_op.setdefault(
                name, {"op": name, "category": categories[i], "ms": 0.0, "runs": 0, "path": paths[i]}
            )
            entry["ms"], entry["runs"] = entry["ms"] + ms, entry["runs"] + 1 / len(devices)  # per device, as ms
    window_ms = (end - start) / 1e6
    for name, row in rows.items():
        row.update(
            category=name,
            label=CATEGORIES[name],
            ops=round(row["ops"] / len(devices)),
            **_times(row["ms"], steps, window_ms),
        )
    notes = (
        [
            f"no op carries the named scope `{s}`: its ops are counted in the other rows"
            for s in SCOPES
            if s not in categories
        ]
        if any(paths)
        else [
            "no op in this trace has a named-scope path (no HLO proto, no op_name stats): attention, the LM head "
            "and loss and the optimizer cannot be separated from the other rows"
        ]
    )
    if looked_up < len(ops):
        notes.append(f"{len(ops) - looked_up} of {len(ops)} ops are not in the trace's HLO: classified by their names")
    others: dict[str, float] = {}
    for op in ops:
        if op.module != MODULE:
            others[op.module] = others.get(op.module, 0.0) + (op.end - op.start) / 1e6 / len(devices)
    if big := {m: ms for m, ms in others.items() if ms >= 0.01 * window_ms}:
        notes.append(
            "the traced steps' window also holds other programs' ops, counted in the rows: "
            + ", ".join(f"{m} {ms:.1f} ms" for m, ms in sorted(big.items(), key=lambda x: -x[1]))
            + " (trace steps away from evaluations and saves: system.profile_steps)"
        )
    top_ops = [
        dict(e, runs=round(e["runs"]), **_times(e["ms"], steps, window_ms))
        for e in sorted(per_op.values(), key=lambda e: -e["ms"])
    ]
    return {
        "trace": str(xplane),
        "module": MODULE,
        "steps": steps,
        "step_ms": round(window_ms / steps, 4),
        "window_ms": round(window_ms, 4),
        "devices": len(devices),
        "ops": len(ops),
        "ops_with_hlo": looked_up,
        "rows": list(rows.values()),
        "notes": notes,
        "top": top_ops[:top],
    }


def _name(op: Op) -> str:
    """The op's name: its HLO instruction's, or, for a kernel of a CUDA graph (whose HLO op is the graph), its own."""
    return op.kernel if op.hlo_op.startswith("command_buffer") else op.hlo_op


def _times(ms: float, steps: int, window_ms: float) -> dict[str, float]:
    return {"ms": round(ms, 4), "ms_per_step": round(ms / steps, 4), "share": round(100 * ms / window_ms, 3)}


def to_markdown(summary: dict) -> str:
    s, rows = summary, summary["rows"]
    total_ms = sum(r["ms"] for r in rows)
    total = {"label": "total", "ops": sum(r["ops"] for r in rows), **_times(total_ms, s["steps"], s["window_ms"])}
    lines = [
        f"trace: {s['trace']}",
        f"{s['steps']} steps of {s['module']}, {s['step_ms']:.2f} ms per step "
        f"({s['window_ms']:.2f} ms in all), {s['devices']} device(s); time is wall time, each instant split among "
        "the ops running then",
        "",
        "| category | ms | ms/step | % of step | ops |",
        "|---|--:|--:|--:|--:|",
    ]
    lines += [
        f"| {r['label']} | {r['ms']:.2f} | {r['ms_per_step']:.2f} | {r['share']:.1f} | {r['ops']} |"
        for r in [*rows, total]
    ]
    lines += [f"note: {n}" for n in summary["notes"]]
    if summary["top"]:
        lines += ["", "| op | category | ms/step | % of step | runs | scope path |", "|---|---|--:|--:|--:|---|"]
        for e in summary["top"]:
            lines.append(
                f"| {e['op']} | {e['category']} | {e['ms_per_step']:.3f} | "
                f"{e['share']:.1f} | {e['runs']} | {e['path'].removeprefix('jit(train_step)/')[-70:]} |"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run directory trained with system.profile_steps=[a,b]")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of Markdown")
    parser.add_argument("--top", type=at_least(0), default=0, metavar="N", help="also list the N most expensive ops")
    args = parser.parse_args(argv)
    traces = sorted((Path(args.run_dir) / layout.PROFILE).glob("plugins/profile/*/*.xplane.pb"))
    if not traces:
        print(
            f"error: no profile in {args.run_dir}: a run traces steps a..b into <run_dir>/profile when trained with "
            f"system.profile_steps=[a,b]",
            file=sys.stderr,
        )
        return 2
    try:
        summary = summarize(traces[-1], args.top, optimized_hlo(Path(args.run_dir), MODULE))
    except LookupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1) if args.json else to_markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
