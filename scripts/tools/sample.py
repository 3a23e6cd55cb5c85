"""Generate from a trained model: text models print text, note models write .mid files.

    python -m scripts.tools.sample RUN_DIR [--which latest|best|STEP] [--prompt "def "] [--num-samples 3]
        [--max-new-tokens 200] [--temperature 0.8] [--top-k 50] [--top-p 0.95] [--seed 0]
    python -m scripts.tools.sample PIANO_RUN_DIR [--prompt-midi piece.mid | --prompt-split full] [--prompt-notes 32]
        [--task continuation|dynamics|lower_voices] [--out samples/]

RUN_DIR is a run directory (runs/<name>) or its checkpoint directory. A text model continues each --prompt; one
fine-tuned on records (loss_masking=finetuning) answers it, asked as its records ask (`prompt <GENAI>`). A note
model continues the first
`--prompt-notes` notes of a MIDI file, or of the first record of a validation split of its own dataset; `--task`
poses a piano task to a fine-tuned model instead (default: the task it was fine-tuned on, if any). Each sample is
written as <out>/sample-<i>.mid with the prompt's notes and the generated ones, next to prompt.mid, each with its piano
roll as a .png (data/piano_roll.py: the prompt's notes blue, the model's orange, shaded by velocity; for the dynamics
task also the chosen velocities against the prompt's). A rerun replaces those files; in an --out folder, one of their
names that it did not write (the maker's name is in each) is refused before the sampling, as is the prompt itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.arguments import OneLineParser, at_least, seed
from core.errors import ConfigError, DataError, PipelineError, say
from models.decode import generate
from models.sampling import check_sampling
from training.checkpoints.storage import check_writable
from training.checkpoints.trained import Trained, add_checkpoint_arguments, load_trained
from training.config import layout


def main(argv: list[str]) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    add_checkpoint_arguments(parser)
    parser.add_argument("--prompt", action="append", help="prompt text (repeatable); default: the start of a document")
    parser.add_argument("--num-samples", type=at_least(1), default=1, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=at_least(0), default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=_top_k, default=None, help="the k most likely ids (0 or none: every id)")
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=seed, default=0)
    notes = parser.add_argument_group("note models")
    notes.add_argument("--prompt-midi", help="a .mid file whose first notes are the prompt")
    notes.add_argument("--prompt-split", default=None, help="a validation split of the model's dataset (default: full)")
    notes.add_argument("--prompt-notes", type=at_least(1), default=None, help="notes of the prompt (default: 32)")
    notes.add_argument("--task", default=None, help="pose this piano task (default: the run's first task, if any)")
    notes.add_argument("--out", default=None, help="folder for the .mid files (default: <run>/samples)")
    args = parser.parse_args(argv)
    try:
        check_sampling(args.temperature, args.top_k, args.top_p, ("--temperature", "--top-k", "--top-p"))
        trained = load_trained(args.path, args.which)
        if trained.tokenizer.kind == "notes":
            refuse_other_kinds_flags(args, ["prompt"], "a note model (notes tokenizer): it takes note prompts")
            return sample_notes(trained, args)
        refuse_other_kinds_flags(args, NOTE_FLAGS, f"a text model ({trained.tokenizer.kind} tokenizer)")
        return sample_text(trained, args)
    except PipelineError as e:
        return say(e)


def _top_k(text: str) -> int | None:
    """--top-k: an int, or none (every id), as the message for a negative one offers."""
    try:
        return None if text.lower() == "none" else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int, or none for every id; got {text!r}") from None


NOTE_FLAGS = ["prompt_midi", "prompt_split", "prompt_notes", "task", "out"]


def refuse_other_kinds_flags(args: argparse.Namespace, flags: list[str], kind: str) -> None:
    """The flags of the other kind of model, set: one line (a text model ignored a missing --prompt-midi file)."""
    given = [f"--{flag.replace('_', '-')}" for flag in flags if getattr(args, flag) is not None]
    if given:
        raise ConfigError(f"{'/'.join(given)}: {args.path} is {kind}; leave {'them' if len(given) > 1 else 'it'} out")


def sample_text(trained: Trained, args: argparse.Namespace) -> int:
    """A pretrained model continues each prompt after a document's start (<EOS>); a fine-tuned one
    (loss_masking=finetuning: records `prompt <GENAI> completion <EOS>`) answers each after its <GENAI>."""
    from training.config.root import LossMasking

    tok = trained.tokenizer
    texts = args.prompt or [""]
    if trained.cfg.loss_masking == LossMasking.finetuning:
        prompts = [tok.encode(text) + [tok.genai_id] for text in texts for _ in range(args.num_samples)]
        shown = 0  # the prompt, <GENAI> and the answer
    else:
        prompts = [[tok.eos_id] + tok.encode(text) for text in texts for _ in range(args.num_samples)]
        shown = 1  # the prompt and its continuation, not the <EOS> before them
    continuations = _generate(trained, prompts, args)
    print(f"# {trained.cfg.model.name}, step {trained.step}, temperature {args.temperature}")
    for prompt_ids, ids in zip(prompts, continuations):
        print("-" * 60)
        print(tok.decode(prompt_ids[shown:] + ids))
    return 0


def _generate(trained: Trained, prompts: list[list[int]], args: argparse.Namespace) -> list[list[int]]:
    """Each prompt's continuation with the command line's sampling settings, stopping at the tokenizer's <EOS>."""
    return generate(
        trained.model,
        prompts,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        eos_id=trained.tokenizer.eos_id,
    )


def sample_notes(trained: Trained, args: argparse.Namespace) -> int:
    from data.midi import read_midi, write_midi
    from data.piano_roll import MAKER, draw_piano_roll
    from data.task_names import DYNAMICS, LOWER_VOICES
    from data.tasks import TASKS, note_prompt, notes_from_generation, top_voice_mask

    tok, cfg = trained.tokenizer, trained.cfg
    task = args.task or (cfg.tasks[0] if cfg.stage == "piano_task" and cfg.tasks else None)
    if task is not None and task not in TASKS:
        raise DataError(f"--task: unknown task {task!r}; choose from {', '.join(TASKS)}")
    if args.prompt_midi:
        given = read_midi(args.prompt_midi)
        source = args.prompt_midi
    else:
        given, source = _first_record(cfg, tok, args.prompt_split)
    given = given.take(slice(0, args.prompt_notes or 32)).shifted_to_zero()
    if len(given) == 0:
        raise DataError(f"the prompt ({source}) has no notes")
    prompt = note_prompt(task, given, tok)
    out = Path(args.out or trained.run_dir / layout.SAMPLES)
    check_writable("--out", out)  # before the sampling: a file in the way is one line
    # a folder of the user's; the run's own samples/ holds only this command's files (some from before they carried
    # its name): there, only the prompt itself is kept
    stems = ["prompt", *(f"sample-{i}" for i in range(args.num_samples))]
    check_own_files(out, stems, args.prompt_midi, others_kept=args.out is not None)
    generated = _generate(trained, [prompt] * args.num_samples, args)
    quantised = tok.quantise(given)
    if task == LOWER_VOICES:  # what the model is shown: the top voice (the lower ones are its answer)
        quantised = quantised.take(top_voice_mask(quantised, tok))
    draw_piano_roll(
        quantised,
        quantised,
        write_midi(quantised, out / "prompt.mid", MAKER).with_suffix(".png"),
        f"prompt: {len(given)} notes of {source}",
    )
    print(
        f"# {cfg.model.name}, step {trained.step}, {task or 'next-token continuation'}, prompt: {len(given)} notes "
        f"of {source}, temperature {args.temperature}"
    )
    for i, ids in enumerate(generated):
        piece = notes_from_generation(task, given, ids, tok)
        path = write_midi(piece, out / f"sample-{i}.mid", MAKER)
        draw_piano_roll(
            piece,
            quantised,
            path.with_suffix(".png"),
            f"sample {i}: {task or 'continuation'}, step {trained.step}",
            dynamics=task == DYNAMICS,
        )
        answered = ""
        if task == DYNAMICS:  # an answer cut short (--max-new-tokens, an early <EOS>): the rest keep the prompt's own
            given_velocities = min(len(piece), sum(tok.token_kind(i)[0] == "velocity" for i in ids))
            if given_velocities < len(piece):
                answered = f"; the model gave {given_velocities} of {len(piece)} velocities, the rest are the prompt's"
        print(
            f"{path} (+ .png, its piano roll): {len(piece)} notes, {piece.end.max():.1f} s ({len(ids)} tokens "
            f"generated{answered})"
        )
    return 0


def check_own_files(out: Path, stems: list[str], prompt_midi: str | None, others_kept: bool = True) -> None:
    """The .mid and .png files of `stems` in `out` that this command would write over: none may be the prompt it
    reads, and (`others_kept`) each must be one it wrote (the maker's name in it; an empty file, a full disk's,
    too). Else one line, before the sampling (a user's prompt.mid, given as --prompt-midi, was replaced by its
    quantised first notes)."""
    from core.pictures import made_by
    from data.midi import written_by
    from data.piano_roll import MAKER

    for path in (out / f"{stem}{suffix}" for stem in stems for suffix in (".mid", ".png")):
        if prompt_midi is not None and path.exists() and path.resolve() == Path(prompt_midi).resolve():
            raise ConfigError(f"--out: it would write over the prompt, {prompt_midi}; choose another --out")
        if not others_kept or not path.exists() and not path.is_symlink():
            continue
        own = path.is_file() and (
            path.stat().st_size == 0 or (written_by if path.suffix == ".mid" else made_by)(path, MAKER)
        )
        if not own:
            raise ConfigError(
                f"--out: {path} exists and is not a file this command wrote; choose another --out, or move it"
            )


def _first_record(cfg, tok, split: str | None):
    """The notes of the first record of a validation split of the run's own dataset (parsed data comes from cache)."""
    from data.corpus import load_corpus
    from data.note_sources import FULL_VAL_SPLIT
    from data.tasks import NoteRecords

    split = split or FULL_VAL_SPLIT
    corpus = load_corpus(cfg.dataset)
    if split not in corpus:
        raise DataError(f"--prompt-split: {split!r} is not a split of {cfg.dataset.name}; it has {', '.join(corpus)}")
    records = NoteRecords(
        corpus[split],
        tok,
        cfg.data.notes_per_record,
        cfg.dataset.pause_detection_threshold,
        cfg.model.context_size,
        [],
        [],
        0,
        [],
    )
    return records.notes(0), f"{cfg.dataset.name}/{split}, record 0"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
