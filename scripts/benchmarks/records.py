"""Benchmark records: a JSON file per measurement under the checkout's benchmarks/results/, and the Markdown tables
made of them.

    python -m scripts.benchmarks.records                          # the tables of benchmarks/results/, printed
    python -m scripts.benchmarks.records --update BENCHMARKS.md   # rewrite the block between its records markers

`bench.py` and `bench_peer.py` write a record of every run on a GPU (and, with `--record DIR`, anywhere): the kind of
measurement, the UTC date, the commit (`+dirty` when the checkout had uncommitted changes; GPT_JAX_COMMIT where no
git checkout is at hand), the device, the JAX version, the command line and the result, as the script printed it. Its
file name holds its date, device, kind and a hash of its content as written (a record corrected later says so in a
field of its own, `commit_note`). The tables are written from the records alone, so a figure in BENCHMARKS.md's
records block can always be traced to its file. benchmarks/results/ is the checkout's (the one this file is in),
from whatever directory a command runs: BENCHMARKS.md's block is made of it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.arguments import OneLineParser

ROOT = Path(__file__).resolve().parents[2]  # the checkout (the project installs it editable)
# The checkout's, not the working directory's: a benchmark run from elsewhere kept its record where no table read it.
RESULTS = ROOT / "benchmarks" / "results"
START, END = "<!-- records:start -->", "<!-- records:end -->"
GIB = 2**30


def commit() -> str:
    """The checkout's commit, `+dirty` when files differ from it; GPT_JAX_COMMIT, where set, instead (a copy of the
    files without their git history, as on a machine the checkout was copied to)."""
    if os.environ.get("GPT_JAX_COMMIT"):
        return os.environ["GPT_JAX_COMMIT"]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
        status = ["git", "status", "--porcelain", "--untracked-files=no"]
        dirty = subprocess.run(status, cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def destination(record: str | None, no_record: bool, on_gpu: bool) -> str | Path | None:
    """Where a benchmark keeps its record: `--record DIR`, else the checkout's benchmarks/results/ on a GPU; nowhere
    with `--no-record` (or off a GPU without `--record`)."""
    if no_record:
        return None
    return record or (RESULTS if on_gpu else None)


def write(directory: str | Path, kind: str, device: str, result: dict, argv: list[str], jax_version: str) -> Path:
    """Keep one measurement as a record file in `directory`; returns its path."""
    now = dt.datetime.now(dt.UTC)
    record = {
        "kind": kind,
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit(),
        "device": device,
        "jax": jax_version,
        "command": shlex.join(argv),
        "result": result,
    }
    if os.environ.get("XLA_FLAGS"):  # as the process ran: the environment's flags and its config's (result.config)
        record["xla_flags_env"] = os.environ["XLA_FLAGS"]
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    path = Path(directory) / f"{now:%Y%m%dT%H%M%S}-{slug(device)}-{kind}-{digest}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


class RecordsError(Exception):
    """A file that is not what it should be (a record, a Markdown file with a records block): one line naming it."""


FIELDS = ("kind", "date", "commit", "device", "result")  # what the tables read of every record


def read(directory: str | Path) -> list[dict]:
    """Every record in `directory`, oldest first (file names start with the date). A `*.json` there that is not a
    record is a RecordsError naming it."""
    records = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RecordsError(f"{path}: not a benchmark record ({e})") from None
        missing = [k for k in FIELDS if k not in record] if isinstance(record, dict) else list(FIELDS)
        if missing:
            raise RecordsError(f"{path}: not a benchmark record (no {', '.join(missing)}); move it out of {directory}")
        records.append(record)
    return records


def _gib(n: Any) -> str:
    return "" if n is None else f"{n / GIB:.1f}"


def _pct(x: Any) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _where(r: dict) -> list[Any]:
    """A record's date, device and commit (`+` where the checkout had uncommitted changes)."""
    return [r["date"][:10], r["device"], r["commit"][:7] + ("+" if r["commit"].endswith("+dirty") else "")]


def bench_rows(records: list[dict]) -> list[list[Any]]:
    rows = []
    for r in records:
        x, c = r["result"], r["result"]["config"]
        batch = f"{c['global_batch']} x {c['context']}"
        if c.get("grad_accum_steps", 1) > 1:
            batch += f" (k={c['grad_accum_steps']})"
        memory = x.get("planned_memory_bytes", x.get("peak_memory_bytes"))
        change = " ".join([x.get("variant", ""), *(f"xla_flags={f}" for f in c.get("xla_flags", []))]).strip()
        rows.append(
            [*_where(r), c["model"], batch, c["dtype"], f"`{change}`" if change else "(as set)"]
            + [f"{x['tokens_per_s']:,.0f}", x["ms_per_step_median"], _pct(x.get("mfu")), _gib(memory), x["compile_s"]]
        )
    return rows


def peer_rows(records: list[dict]) -> list[list[Any]]:
    rows = []
    for r in records:
        x, c = r["result"], r["result"]["config"]
        ours, theirs = x["ours"], x["nanogpt"]
        rows.append(
            [
                *_where(r),
                c["model"],
                f"{c['batch']} x {c['context']}",
                f"`{c['ours_overrides']}`" * bool(c["ours_overrides"]),
            ]
            + [f"{ours['tokens_per_s']:,.0f}", f"{theirs['tokens_per_s']:,.0f}", f"**{x['ratio']:.3f}x**"]
            + [_pct(ours.get("mfu")), _pct(theirs.get("mfu"))]
        )
    return rows


def tables(records: list[dict]) -> str:
    """The Markdown of every record, a table per kind, in the order the records were made."""
    out: list[str] = []
    bench = [r for r in records if r["kind"] == "bench"]
    peer = [r for r in records if r["kind"] == "bench_peer"]
    if bench:
        title = "Train step (`bench.py`; MFU 6N + 12·L·C·T of the device's data-sheet peak; memory: XLA's plan)"
        out += [title, ""]
        header = ["date", "device", "commit", "model", "batch", "dtype", "variant", "tokens/s", "ms/step", "MFU"]
        out += _table(header + ["memory GiB", "compile s"], bench_rows(bench)) + [""]
    if peer:
        out += ["Against nanoGPT in the same run (`bench_peer.py`: alternating rounds, median step)", ""]
        header = ["date", "device", "commit", "model", "batch", "our overrides", "ours tokens/s", "nanoGPT tokens/s"]
        out += _table(header + ["ratio", "our MFU", "nanoGPT MFU"], peer_rows(peer)) + [""]
    return "\n".join(out).rstrip() + "\n"


def update(markdown: Path, directory: str | Path) -> None:
    """Rewrite the block between the records markers of `markdown` with the tables of `directory`'s records."""
    try:
        text = markdown.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RecordsError(f"{markdown}: cannot read it ({e})") from None
    if START not in text or END not in text:
        raise RecordsError(f"{markdown} has no {START} ... {END} block to rewrite")
    head, rest = text.split(START, 1)
    if END not in rest:
        raise RecordsError(f"{markdown}: its {END} comes before its {START}; put the end marker after the start")
    _, tail = rest.split(END, 1)
    markdown.write_text(f"{head}{START}\n{tables(read(directory))}{END}{tail}")


def main(argv: list[str]) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("directory", nargs="?", default=str(RESULTS), help=f"the records' folder (default {RESULTS})")
    p.add_argument("--update", metavar="MARKDOWN", help="rewrite this file's records block instead of printing")
    args = p.parse_args(argv)
    if not Path(args.directory).is_dir():
        print(f"error: {args.directory}: no such folder of records", file=sys.stderr)
        return 2
    if args.update and not Path(args.update).is_file():
        print(f"error: --update {args.update}: no such file (a Markdown file with a records block)", file=sys.stderr)
        return 2
    try:
        if args.update:
            update(Path(args.update), args.directory)
        else:
            print(tables(read(args.directory)), end="")
    except RecordsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
