"""The optimizer leaderboard's presets: conf/optimizer/<name>.yaml of every tuned optimizer rewritten with the board's
step size (and its knob's value where that beat the preset's by more than the board's noise), every comment kept and
the one above the schedule saying where the values come from."""

from __future__ import annotations

import math
import statistics
import textwrap
from pathlib import Path

from scripts.experiments.leaderboard_settings import (
    LR,
    PLANS,
    ROOT,
    board_kind,
    board_model,
    check_boards,
    docs_name,
    loss_of,
    read_records,
    text,
)
from scripts.experiments.leaderboard_table import choice_centres, knob_points


def yaml_number(value: float) -> str:
    """`text(value)` as YAML 1.1 reads a float (PyYAML takes 2e-06 for a string: the mantissa needs a dot)."""
    written = text(value)
    mantissa, _, exponent = written.partition("e")
    return f"{mantissa}.0e{exponent}" if exponent and "." not in mantissa else written


def set_value(lines: list[str], dotted: str, value: str, note: str = "") -> bool:
    """Set `dotted` (e.g. `lr_config.lr`, `groups.adam.lr_multiplier`) in a preset's YAML lines to `value`, keeping
    every comment; False when the key is not there."""
    at, parts = 0, dotted.split(".")
    for depth, part in enumerate(parts):
        indent = "  " * depth
        for i in range(at, len(lines)):
            line = lines[i]
            if line.startswith(indent + part + ":"):
                at = i
                break
            if line.strip() and not line.lstrip().startswith("#") and len(line) - len(line.lstrip()) < len(indent):
                return False  # left the enclosing block
        else:
            return False
        if depth < len(parts) - 1:
            at += 1
    old = lines[at]
    comment = old[old.index("#") :] if "#" in old else note
    lines[at] = f"{'  ' * (len(parts) - 1)}{parts[-1]}: {value}" + (f"  {comment}" if comment else "")
    return True


def write_presets(out: Path) -> list[str]:
    """conf/optimizer/<name>.yaml of every tuned optimizer takes the board's step size, and its knob's value where
    that beat the preset's by more than the board's median seed spread (less is noise: the field's value stays); the
    comment above the schedule says where the values come from. Returns what changed, one line per preset."""
    records = read_records(out)
    board = check_boards(records, out)
    steps, tokens_per_step = board["steps"], board["tokens_per_step"]
    model = board_model(board) or "its model"
    centres = choice_centres(records)
    losses = [[s["val_loss"] for s in r["seeds"]] for r in records]
    spreads = [max(x) - min(x) for x in losses if all(map(math.isfinite, x))] or [0.0]  # a failed seed: none
    noise = statistics.median(spreads)  # as the table's (leaderboard_table.py): of two, their mean
    changed = []
    for r in records:
        name, plan = r["optimizer"], PLANS[r["optimizer"]]
        path = ROOT / "conf" / "optimizer" / f"{name}.yaml"
        lines = path.read_text().splitlines()
        tuned = dict(o.split("=", 1) for o in r["tuned"])
        step = float(tuned[plan.step])
        points = [v for v, _ in r["step_grid"]["points"]]
        what = [f"{plan.step.removeprefix('optimizer.')}={text(step)}"]
        source = (
            f"the leaderboard's best (docs/{docs_name(*board_kind(board))}.md: {model}, {steps} steps of "
            f"{tokens_per_step:,} tokens), of {len(points)} factor-2 points {text(min(points))}..{text(max(points))}"
        )
        set_value(lines, plan.step.removeprefix("optimizer."), yaml_number(step), "")
        knob_note = ""
        finite = plan.knob and r["knob_grid"] and [p for p in knob_points(r, centres) if math.isfinite(p[1])]
        if finite:
            value, loss = min(finite, key=lambda p: p[1])  # the preset's value among them: the step grid's best
            gain = loss_of(r["step_grid"]["best"]) - loss
            key = plan.knob.removeprefix("optimizer.")
            if gain > noise:
                set_value(lines, key, yaml_number(value) if plan.scale != "choice" else str(int(value)))
                what.append(f"{key}={text(value)}")
                knob_note = f" {key} the board's too ({gain:.3f} lower val loss per token than the preset's)."
            else:
                knob_note = f" {key} kept: the board's best ({text(value)}) was within its noise of it."
        start = next(
            (i for i, line in enumerate(lines) if line.startswith("# The schedule (optimizers/schedules.py)")), None
        )
        if start is not None and plan.step == LR:
            end = next(i for i in range(start, len(lines)) if lines[i].startswith("lr_config:"))
            warmup = next(line.split(":", 1)[1].strip() for line in lines[end:] if line.startswith("  warmup:"))
            floor = next(line.split(":", 1)[1].strip() for line in lines[end:] if line.startswith("  min_lr_ratio:"))
            paragraph = (
                f"The schedule (optimizers/schedules.py): its lr is {source}.{knob_note} Warmup {warmup} of the run "
                f"(or steps, from 1); the floor {floor} of the peak."
            )
            lines[start:end] = textwrap.wrap(paragraph, 118, initial_indent="# ", subsequent_indent="# ")
        else:
            set_value(lines, plan.step.removeprefix("optimizer."), yaml_number(step), f"# {source}")
        path.write_text("\n".join(lines) + "\n")
        changed.append(f"{name}: {' '.join(what)}")
    return changed
