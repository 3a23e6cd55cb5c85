"""The HLO a profile's ops are looked up in (scripts/tools/profile_summary.py): each instruction's named-scope path,
opcodes (a fusion's include its fused body's) and custom-call targets, from the HLO protos a jax.profiler trace stores,
or from the optimised HLO text of an XLA dump, whose names are those a GPU's kernels carry."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

XLA_DUMP = "xla_dump"  # where a run's optimised HLO is looked for (--xla_dump_to=<run_dir>/xla_dump)

Instructions = dict[str, tuple[str, set[str], str]]  # instruction -> (scope path, opcodes, custom-call targets)


def _fields(buf: memoryview) -> Iterator[tuple[int, Any]]:
    """(field number, value) of a serialized protobuf message: varints as ints, length-delimited fields as bytes. The
    trace's HLO protos are read with this because no installed package ships XLA's generated proto classes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        if key & 7 == 0:
            value, i = _varint(buf, i)
        elif key & 7 == 2:
            size, i = _varint(buf, i)
            value, i = buf[i : i + size], i + size
        else:  # fixed 64 or 32 bits: no field read here has them
            value, i = None, i + (8 if key & 7 == 1 else 4)
        yield key >> 3, value


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    value = shift = 0
    while buf[i] & 0x80:
        value, i, shift = value | (buf[i] & 0x7F) << shift, i + 1, shift + 7
    return value | buf[i] << shift, i + 1


def _message(buf: memoryview) -> dict[int, list]:
    out: dict[int, list] = defaultdict(list)
    for number, value in _fields(buf):
        out[number].append(value)
    return out


def _text(values: list) -> str:
    return bytes(values[0]).decode() if values else ""


def hlo_instructions(xplane: bytes) -> dict[tuple[str, int | None], Instructions]:
    """{(module, program id): {instruction: (scope path, opcodes, custom-call targets)}} from the HLO protos in the
    trace's `/host:metadata` plane (XSpace.planes = 1; XPlane name 2, event_metadata 4, stat_metadata 5)."""
    modules = {}
    for plane in (_message(v) for n, v in _fields(memoryview(xplane)) if n == 1):
        if _text(plane[2]) != "/host:metadata":
            continue
        stat_names = {m[1][0]: _text(m[2]) for m in (_message(_message(e)[2][0]) for e in plane[5])}
        for meta in (_message(_message(e)[2][0]) for e in plane[4]):  # XEventMetadata: name 2 ("module(id)"), stats 5
            module, _, program = _text(meta[2]).rstrip(")").partition("(")
            for stat in map(_message, meta[5]):  # XStat: metadata id 1, bytes 6
                if stat_names.get(stat[1][0], "").replace(" ", "_").lower() == "hlo_proto" and stat[6]:
                    key = (module, int(program) if program.isdigit() else None)
                    modules[key] = _instructions(_message(_message(stat[6][0])[1][0]))  # HloProto.hlo_module
    return modules


def _instructions(module: dict) -> Instructions:
    """Each instruction's path, opcodes and targets; a fusion's include its fused body's, less the scalar index
    arithmetic of its slices (so that a fused copy still reads as a copy)."""
    computations = {}
    for comp in map(_message, module[3]):  # HloModuleProto.computations: id 5, instructions 2
        computations[comp[5][0] if comp[5] else 0] = [
            (  # name 1, opcode 2, shape 3, op_name 7.2, target 28, calls 38
                _text(inst[1]),
                _text(inst[2]),
                _text(_message(inst[7][0])[2]) if inst[7] else "",
                _text(inst[28]),
                [v for c in inst[38] for v in ([c] if isinstance(c, int) else _packed(c))],
                bool(inst[3]) and not {3, 4} & _message(inst[3][0]).keys(),
            )  # ShapeProto: dimensions 3, tuple shapes 4
            for inst in map(_message, comp[2])
        ]
    return _flatten(computations)


def _flatten(computations: dict[Any, list[tuple]]) -> Instructions:
    """{instruction: (scope path, opcodes, custom-call targets)} of computations given as lists of (name, opcode,
    op_name, target, called computations, is scalar)."""

    def body(called: list) -> tuple[str, set[str], str]:
        path, opcodes, targets = "", set(), ""
        for _name, opcode, op_name, target, inner, scalar in (i for c in called for i in computations.get(c, [])):
            sub = body(inner) if opcode == "fusion" else ("", set(), "")
            path, targets = path or op_name or sub[0], targets + target + sub[2]
            opcodes |= sub[1] | (set() if scalar else {opcode})
        return path, opcodes, targets

    out = {}
    for name, opcode, op_name, target, called, _ in (i for insts in computations.values() for i in insts):
        fused = body(called) if opcode == "fusion" else ("", set(), "")
        out[name] = (op_name or fused[0], {opcode} | fused[1], target + fused[2])
    return out


HLO_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
HLO_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = (\S+|\(.*?\)) ([a-z][a-z0-9\-]*)\((.*)$")


def text_instructions(text: str) -> Instructions:
    """The same as `_instructions`, from a module's HLO text (XLA's `--xla_dump_to` files), whose names are those
    of the optimised program: the fusions and library calls a GPU's kernels are named after."""
    computations: dict[str, list[tuple]] = {}
    current: list[tuple] = []
    for line in text.splitlines():
        if m := HLO_COMPUTATION.match(line):
            current = computations.setdefault(m.group(1), [])
        elif m := HLO_INSTRUCTION.match(line):
            name, shape, opcode, rest = m.groups()
            op_name = re.search(r'op_name="([^"]*)"', rest)
            target = re.search(r'custom_call_target="([^"]*)"', rest)
            called = re.findall(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)", rest)
            for group in re.findall(r"(?:calls|branch_computations)=\{([^}]*)\}", rest):
                called += re.findall(r"%?([\w.\-]+)", group)
            scalar = bool(re.fullmatch(r"[a-z0-9]+\[\](?:\{\})?", shape))
            current.append((name, opcode, op_name[1] if op_name else "", target[1] if target else "", called, scalar))
    return _flatten(computations)


def kernel_key(name: str) -> str:
    """An HLO instruction's name as a GPU kernel is named after it (XLA writes `loop_fusion.4` as `loop_fusion_4`)."""
    return re.sub(r"[.\-]", "_", name)


def optimized_hlo(run_dir: Path, module: str) -> Instructions:
    """`module`'s optimised HLO from an XLA dump in the run directory (`system.xla_flags` with
    `--xla_dump_to=<run_dir>/xla_dump`), keyed by kernel name; {} without one."""
    dumps = sorted((run_dir / XLA_DUMP).glob(f"*{module}*after_optimizations.txt"), key=lambda f: f.stat().st_size)
    if not dumps:
        return {}
    return {kernel_key(name): v for name, v in text_instructions(dumps[-1].read_text()).items()}


def _packed(buf: memoryview) -> Iterator[int]:
    i = 0
    while i < len(buf):
        value, i = _varint(buf, i)
        yield value
