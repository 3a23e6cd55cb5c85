"""A piece as a picture: the piano roll of a generated .mid (pitch against time, each note a bar shaded by its
velocity, the prompt's notes and the model's in two colours), and for the dynamics task the velocities the model
chose against the prompt's own. scripts/tools/sample.py writes one beside every .mid it writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.pictures import save_picture
from data.notes import Notes

MAKER = "sample"  # scripts/tools/sample.py, which writes the piano rolls and the .mid files beside them

PROMPT_COLOUR = (0.12, 0.47, 0.71)  # blue: the notes the model was given
MODEL_COLOUR = (1.0, 0.50, 0.05)  # orange: the notes (or, for dynamics, the velocities) the model wrote


def from_prompt(piece: Notes, prompt: Notes) -> np.ndarray:
    """[N] bool: which notes of `piece` are the prompt's (the same pitch, start and end)."""
    given = set(zip(prompt.pitch.tolist(), np.round(prompt.start, 6).tolist(), np.round(prompt.end, 6).tolist()))
    return np.array(
        [
            (p, s, e) in given
            for p, s, e in zip(piece.pitch.tolist(), np.round(piece.start, 6).tolist(), np.round(piece.end, 6).tolist())
        ],
        bool,
    )


def draw_piano_roll(piece: Notes, prompt: Notes, path: str | Path, title: str = "", dynamics: bool = False) -> Path:
    """Write `path` (PNG). `dynamics`: the piece is the prompt's notes with the model's velocities; they are drawn in
    the model's colour, and a second panel sets each note's chosen velocity against the prompt's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    path = Path(path)
    given = np.zeros(len(piece), bool) if dynamics else from_prompt(piece, prompt)  # dynamics: every velocity is new
    panels = 2 if dynamics else 1
    fig, axes = plt.subplots(
        1, panels, figsize=(10 + 3.5 * (panels - 1), 4.2), squeeze=False, gridspec_kw={"width_ratios": [3, 1][:panels]}
    )
    roll = axes[0, 0]
    for p, v, s, e, ours in zip(piece.pitch, piece.velocity, piece.start, piece.end, ~given):
        shade = 0.25 + 0.75 * float(v) / 127  # louder: more opaque
        roll.add_patch(
            Rectangle(
                (float(s), float(p) - 0.4),
                float(e - s),
                0.8,
                linewidth=0,
                facecolor=(*(MODEL_COLOUR if ours else PROMPT_COLOUR), shade),
            )
        )
    if len(piece):
        roll.set_xlim(0, float(piece.end.max()) * 1.02)
        roll.set_ylim(float(piece.pitch.min()) - 2, float(piece.pitch.max()) + 2)
    roll.set_xlabel("time (s)")
    roll.set_ylabel("pitch (MIDI)")
    roll.set_title(title or path.stem, fontsize=10)
    roll.grid(alpha=0.2)
    handles = [Rectangle((0, 0), 1, 1, color=PROMPT_COLOUR, label="prompt")] if given.any() or dynamics else []
    if (~given).any():  # only what the picture shows
        handles.append(
            Rectangle((0, 0), 1, 1, color=MODEL_COLOUR, label="model" + (": velocities" if dynamics else ""))
        )
    roll.legend(handles=handles, loc="upper right", fontsize=8)
    if dynamics:
        ax = axes[0, 1]
        n = min(len(piece), len(prompt))
        ax.scatter(prompt.velocity[:n], piece.velocity[:n], s=12, color=MODEL_COLOUR)
        ax.plot([0, 127], [0, 127], color=PROMPT_COLOUR, lw=1)
        ax.set_xlim(0, 128)
        ax.set_ylim(0, 128)
        ax.set_xlabel("the prompt's velocity")
        ax.set_ylabel("the model's velocity")
        ax.set_title("dynamics", fontsize=10)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_picture(fig, path, MAKER, 90)  # its maker's name in the .png: a rerun of the sampler replaces its own
    plt.close(fig)
    return path
