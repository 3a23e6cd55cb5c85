"""Stages end to end: pretraining on the music21 corpus, fine-tuning a piano task from that checkpoint, per-composer
evaluation, a generated .mid; the maestro (Hub) layout from a local folder; text fine-tuning records; init_from."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import chex
import jax
import jax.numpy as jnp
import mido
import numpy as np
import pytest

from core.errors import ConfigError, DataError
from data.corpus import load_corpus
from data.notes import Notes
from helpers import (
    build,
    communicate,
    read_metrics,
    repo_copy,
    run_cli,
    run_in_process,
    script_in_process,
    spawn,
    tiny_overrides,
)
from training import config as config_lib
from training.checkpoints.checkpointer import Checkpointer
from training.checkpoints.resume import plan_run, restore_state

pytestmark = pytest.mark.e2e


def piano_overrides(cache: str, run_dir, *extra: str) -> list[str]:
    """gpt2-tiny on a few music21 pieces per composer (the smallest three, one each for train, val and test: parsing
    is what costs, beethoven's quartets take 19 s), records of 12 notes (about 45 tokens), 8 a step."""
    return tiny_overrides(
        cache,
        "dataset=music21",
        "dataset.tokenizer=notes",
        "dataset.composers=[bach,mozart,haydn]",
        "dataset.eval_composers=[bach,mozart,haydn]",
        "dataset.max_pieces_per_composer=3",
        "data.notes_per_record=12",
        "train.batch_size=8",
        "train.max_steps=40",
        "train.eval_interval=20",
        "train.eval_iters=2",
        "train.log_interval=10",
        "optimizer.lr_config.lr=3e-3",
        f"logging.run_dir={run_dir}",
        *extra,
    )


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, data_cache):
    run_dir = tmp_path_factory.mktemp("piano") / "pretrain"
    result = run_cli(piano_overrides(data_cache, run_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def finetuned(pretrained, data_cache):
    run_dir = pretrained.parent / "finetune"
    result = run_cli(
        piano_overrides(
            data_cache,
            run_dir,
            f"init_from={pretrained}",
            "stage=piano_task",
            "tasks=[dynamics]",
            "loss_masking=finetuning",
            "train.eval_at_start=true",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, result


def test_pretraining_on_the_music21_corpus_evaluates_each_composer(pretrained):
    final = {r["split"]: r["loss"] for r in read_metrics(pretrained) if r["step"] == 40 and r["split"] != "train"}
    assert list(final) == ["full", "bach", "mozart", "haydn"]
    train = read_metrics(pretrained, "train")
    assert train[-1]["loss"] < train[0]["loss"] - 0.5


def test_fine_tuning_a_task_beats_the_pretrained_weights_on_its_target_tokens(finetuned):
    run_dir, result = finetuned
    full = {r["step"]: r["loss"] for r in read_metrics(run_dir, "full")}
    assert sorted(full) == [0, 20, 40]  # step 0: the pretrained weights on the task, before any update
    assert full[40] < full[0] - 0.5
    assert "weights from" in result.stdout and "tasks dynamics, loss masking finetuning" in result.stdout
    for composer in ("bach", "mozart", "haydn"):
        losses = {r["step"]: r["loss"] for r in read_metrics(run_dir, composer)}
        assert sorted(losses) == [0, 20, 40] and losses[40] < losses[0]


def test_eval_only_scores_the_pretrained_weights_on_a_task(pretrained, finetuned, data_cache, capsys):
    run_dir, _ = finetuned
    result = run_in_process(
        piano_overrides(
            data_cache,
            pretrained,
            "eval_only=true",
            "checkpoint.load=True",
            f"checkpoint.load_path={pretrained}",
            "checkpoint.overwrite_config=True",
            "stage=piano_task",
            "tasks=[dynamics]",
            "loss_masking=finetuning",
        ),
        capsys,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads((pretrained / "eval-step40.json").read_text())["results"]
    assert list(scores) == ["full", "bach", "mozart", "haydn", "test"]
    step0 = {r["split"]: r["loss"] for r in read_metrics(run_dir) if r["step"] == 0}
    # the fine-tune's starting point: the same weights, evaluated by another run's program: a few ulp of a loss ~5
    assert scores["full"]["loss"] == pytest.approx(step0["full"], rel=1e-5)


def test_a_fine_tuned_model_writes_a_playable_midi(finetuned, tmp_path, monkeypatch, capsys):
    run_dir, _ = finetuned
    result = script_in_process(
        "scripts.tools.sample",
        [str(run_dir), "--max-new-tokens", "30", "--out", str(tmp_path), "--prompt-notes", "12"],
        monkeypatch,
        capsys,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "dynamics" in result.stdout
    midi = mido.MidiFile(str(tmp_path / "sample-0.mid"))
    ons = [m for m in midi if m.type == "note_on" and m.velocity > 0]
    assert len(ons) == 12 and midi.length > 0  # the prompt's 12 notes, with the velocities the model chose
    blue, orange = roll_colours(tmp_path / "sample-0.png")  # the model's velocities, and the prompt's diagonal
    assert blue > 0 and orange > 0
    # an answer cut short: the notes it did not reach keep the prompt's velocities, which were shown as the model's
    args = [str(run_dir), "--max-new-tokens", "2", "--out", str(tmp_path), "--prompt-notes", "12"]
    result = script_in_process("scripts.tools.sample", args, monkeypatch, capsys)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"; the model gave [0-2] of 12 velocities, the rest are the prompt's\)$", result.stdout, re.M)
    below_a_file = tmp_path / "sample-0.mid" / "more"  # one line before the sampling (mkdir's traceback after it)
    args = [str(run_dir), "--max-new-tokens", "30", "--out", str(below_a_file)]
    result = script_in_process("scripts.tools.sample", args, monkeypatch, capsys)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: --out: {below_a_file}: {tmp_path / 'sample-0.mid'} is a file, not a directory; choose a directory"
    ], result.stderr
    # a text prompt, which a note model cannot read, was ignored: a continuation of its own record instead
    result = script_in_process("scripts.tools.sample", [str(run_dir), "--prompt", "def "], monkeypatch, capsys)
    assert (result.returncode, result.stdout) == (2, "") and result.stderr == (
        f"error: --prompt: {run_dir} is a note model (notes tokenizer): it takes note prompts; leave it out\n"
    )


def test_a_pretrained_model_continues_a_midi_prompt(pretrained, tmp_path, bach_chorale, monkeypatch, capsys):
    from data.midi import write_midi

    prompt = write_midi(bach_chorale, tmp_path / "prompt-in.mid")
    result = script_in_process(
        "scripts.tools.sample",
        [
            str(pretrained),
            "--prompt-midi",
            str(prompt),
            "--prompt-notes",
            "10",
            "--max-new-tokens",
            "40",
            "--out",
            str(tmp_path / "out"),
            "--temperature",
            "1.0",
        ],
        monkeypatch,
        capsys,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "next-token continuation" in result.stdout
    assert mido.MidiFile(str(tmp_path / "out" / "sample-0.mid")).length > 0
    assert len([m for m in mido.MidiFile(str(tmp_path / "out" / "prompt.mid")) if m.type == "note_on"]) == 10
    notes = len(
        [m for m in mido.MidiFile(str(tmp_path / "out" / "sample-0.mid")) if m.type == "note_on" and m.velocity > 0]
    )
    blue, orange = roll_colours(tmp_path / "out" / "sample-0.png")
    assert blue > 0 and (orange > 0) == (notes > 10)  # the prompt's notes blue, the model's orange
    assert roll_colours(tmp_path / "out" / "prompt.png")[1] == 0
    # lower_voices shows the model the top voice: that is the prompt drawn and written (the rest is its answer)
    from data.notes_tokenizer import NotesTokenizer
    from data.tasks import top_voice_mask

    args = [str(pretrained), "--prompt-midi", str(prompt), "--prompt-notes", "10", "--max-new-tokens", "8"]
    result = script_in_process(  # into the same folder: its own files are replaced
        "scripts.tools.sample", [*args, "--task", "lower_voices", "--out", str(tmp_path / "out")], monkeypatch, capsys
    )
    assert result.returncode == 0, result.stderr[-2000:]
    given = NotesTokenizer().quantise(bach_chorale.take(slice(0, 10)).shifted_to_zero())
    top = int(top_voice_mask(given, NotesTokenizer()).sum())
    assert 0 < top < 10
    assert len([m for m in mido.MidiFile(str(tmp_path / "out" / "prompt.mid")) if m.type == "note_on"]) == top
    # a file of the names it writes that it did not write, or the prompt itself, is one line before the sampling:
    # a user's prompt.mid given as --prompt-midi was replaced by its quantised first notes, a picture by a roll
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    shutil.copy(prompt, mine / "prompt.mid")
    (theirs / "sample-0.png").write_text("my notes")
    for given, out, message in (
        (mine / "prompt.mid", mine, f"it would write over the prompt, {mine / 'prompt.mid'}; choose another --out"),
        (
            prompt,
            theirs,
            f"{theirs / 'sample-0.png'} exists and is not a file this command wrote; choose another --out, or move it",
        ),
    ):
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        args = [str(pretrained), "--prompt-midi", str(given), "--max-new-tokens", "8", "--out", str(out)]
        result = script_in_process("scripts.tools.sample", args, monkeypatch, capsys)
        assert (result.returncode, result.stderr) == (2, f"error: --out: {message}\n")
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_the_runs_own_samples_folder_is_replaced_whoever_wrote_it_but_never_the_prompt(tmp_path):
    """<run>/samples (no --out) held files of versions before the maker's name: a rerun there replaces them; the
    prompt read from there is still kept."""
    from scripts.tools.sample import check_own_files

    (tmp_path / "sample-0.mid").write_text("written before the maker's name")
    (tmp_path / "sample-0.png").write_text("so was this")
    check_own_files(tmp_path, ["prompt", "sample-0"], None, others_kept=False)
    with pytest.raises(ConfigError, match="exists and is not a file this command wrote"):
        check_own_files(tmp_path, ["prompt", "sample-0"], None)
    with pytest.raises(ConfigError, match="it would write over the prompt"):
        check_own_files(tmp_path, ["prompt", "sample-0"], str(tmp_path / "sample-0.mid"), others_kept=False)


def roll_colours(png) -> tuple[int, int]:
    """Pixels of a piano roll in the prompt's blue and in the model's orange (each blended with white by its shade)."""
    from matplotlib.image import imread

    rgb = imread(str(png))[..., :3].astype(float)
    assert rgb.shape[0] > 200 and rgb.shape[1] > 400  # a readable picture
    r, b = rgb[..., 0], rgb[..., 2]
    return int(np.sum(b - r > 0.12)), int(np.sum(r - b > 0.2))


def test_a_piano_roll_draws_the_prompt_and_the_model_in_two_colours(tmp_path):
    from data.notes import Notes
    from data.piano_roll import draw_piano_roll, from_prompt

    prompt = Notes.from_lists([60, 64, 67], [40, 80, 120], [0.0, 0.5, 1.0], [0.5, 1.0, 1.5])
    piece = Notes.from_lists(
        [60, 64, 67, 72, 71], [40, 80, 120, 100, 60], [0.0, 0.5, 1.0, 1.5, 2.0], [0.5, 1.0, 1.5, 2.0, 2.5]
    )
    assert from_prompt(piece, prompt).tolist() == [True, True, True, False, False]
    blue, orange = roll_colours(draw_piano_roll(piece, prompt, tmp_path / "roll.png"))
    assert blue > 500 and orange > 300
    assert roll_colours(draw_piano_roll(prompt, prompt, tmp_path / "prompt.png"))[1] == 0  # the prompt alone: blue


def test_init_from_loads_the_weights_and_resets_optimizer_and_step(pretrained, data_cache):
    overrides = piano_overrides(
        data_cache,
        pretrained.parent / "unused",
        f"init_from={pretrained}",
        "stage=piano_task",
        "tasks=[continuation]",
        "loss_masking=finetuning",
    )
    cfg = config_lib.load_config(overrides)
    plan = plan_run(cfg, overrides, 0)
    parts = build(overrides, plan.init_from)
    fresh_opt_state = parts.state.opt_state
    state = restore_state(parts.state, plan)
    reader = Checkpointer(pretrained / "checkpoints", read_only=True)
    saved = reader.restore_model(reader.resolve("latest"), state.model)
    assert int(state.step) == 0 and reader.resolve("latest") == 40
    chex.assert_trees_all_equal(state.model, saved)
    chex.assert_trees_all_equal(state.opt_state, fresh_opt_state)
    mu = jax.tree.leaves(state.opt_state)
    assert all(float(jnp.abs(x).max()) == 0.0 for x in mu if x.ndim > 1)  # Adam moments start at zero


def test_init_from_with_another_notes_tokenizer_is_refused(pretrained, data_cache, tmp_path, capsys):
    result = run_in_process(
        piano_overrides(
            data_cache, tmp_path / "run", f"init_from={pretrained}", "dataset.notes_tokenizer.velocity_bins=16"
        ),
        capsys,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: dataset.notes_tokenizer:") and "checkpoint" in lines[-1]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_piano_checkpoint_starting_a_text_run_is_refused_without_a_setting_to_try(pretrained, data_cache, capsys):
    """The line said `set dataset.tokenizer=notes`, which a text source refuses in turn."""
    result = run_in_process(tiny_overrides(data_cache, f"init_from={pretrained}"), capsys)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "error: dataset.tokenizer: the checkpoint's model reads notes, this run's data is text (byte): start it from a "
        "checkpoint of a text run, or from fresh weights"
    )


def test_finetune_piano_sh_names_a_run_directory_that_is_not_there(tmp_path):
    """A mistyped run directory was passed on to Hydra as an override: `cannot parse the argument`, nothing said of
    the directory."""
    project = repo_copy(tmp_path)  # the script works in its own checkout: a copy, should it go on to train
    for typo in ("runs/piano-pretrain-typo", "~/runs/typo"):
        proc = spawn(
            ["bash", str(project / "scripts" / "finetune_piano.sh"), typo, "train.max_steps=2"],
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        result = communicate(proc, timeout=30)
        assert (result.returncode, result.stderr.strip()) == (
            1,
            f"error: PRETRAIN_RUN_DIR {typo}: no such directory; pass a run of bash scripts/pretrain_piano.sh",
        )
    # a flag or an override is no directory: the newest pretrained run is looked for (there is none in the copy)
    for first in ("--cfg", "train.max_steps=2"):
        proc = spawn(
            ["bash", str(project / "scripts" / "finetune_piano.sh"), first],
            cwd=project,
            stderr=subprocess.PIPE,
            text=True,
        )
        result = communicate(proc, timeout=30)
        assert result.returncode == 1 and result.stderr.startswith("error: no pretrained run found"), result.stderr


def write_maestro_layout(folder, pieces_per_split: dict[str, list[tuple[str, Notes]]]) -> None:
    """A dataset as the Hub serves maestro-style piano data: a `notes` struct column and a JSON `source` column."""
    import datasets

    (folder / "data").mkdir(parents=True)
    for split, pieces in pieces_per_split.items():
        rows = {
            "notes": [
                {
                    "pitch": n.pitch.tolist(),
                    "velocity": n.velocity.tolist(),
                    "start": n.start.tolist(),
                    "end": n.end.tolist(),
                    "duration": (n.end - n.start).tolist(),
                }
                for _, n in pieces
            ],
            "source": [
                json.dumps({"composer": c, "title": f"piece {i}", "midi_filename": f"{i}.midi"})
                for i, (c, _) in enumerate(pieces)
            ],
        }
        datasets.Dataset.from_dict(rows).to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))


def test_the_maestro_layout_loads_from_a_local_folder_through_the_hub_code_path(tmp_path, bach_chorale):
    rng = np.random.default_rng(0)

    n = bach_chorale
    pieces = [Notes(np.clip(n.pitch + k, 0, 127), rng.integers(30, 100, len(n)), n.start, n.end) for k in range(7)]

    def piece(k: int) -> Notes:
        return pieces[k]

    write_maestro_layout(
        tmp_path / "maestro",
        {
            "train": [("Johann Sebastian Bach", piece(0)), ("Frédéric Chopin", piece(1)), ("Franz Liszt", piece(2))],
            "validation": [
                ("Johann Sebastian Bach", piece(3)),
                ("Frédéric Chopin", piece(4)),
                ("Franz Liszt", piece(5)),
            ],
            "test": [("Wolfgang Amadeus Mozart", piece(6))],
        },
    )
    cfg = config_lib.load_config(
        [
            "dataset=maestro",
            f"dataset.base_dataset_name={tmp_path / 'maestro'}",
            f"dataset.cache_dir={tmp_path / 'cache'}",
        ]
    )
    corpus = load_corpus(cfg.dataset)
    assert list(corpus) == ["train", "full", "bach", "chopin", "test"]
    assert [len(corpus[s]) for s in corpus] == [3, 3, 1, 1, 1]
    assert corpus["chopin"][0]["composer"] == "Frédéric Chopin"
    row, written = corpus["bach"][0], piece(3)
    expected = Notes.from_lists(written.pitch, written.velocity, written.start, written.end)
    for column in ("pitch", "velocity", "start", "end"):
        np.testing.assert_array_equal(row[column], getattr(expected, column))


def test_an_unreachable_hub_dataset_is_one_clear_line(tmp_path, capsys):
    # in this process: test_end_to_end.py's offline Hub dataset runs in one of its own
    result = run_in_process(
        [
            "dataset=maestro",
            "dataset.base_dataset_name=epr-labs/no-such-piano-dataset",
            f"dataset.cache_dir={tmp_path}",
            "model=gpt2-tiny",
            "logging.wandb=disabled",
            f"logging.run_dir={tmp_path / 'run'}",
            f"system.compilation_cache_dir={tmp_path / 'jax'}",  # not the default .cache/jax in the checkout
        ],
        capsys,
    )
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: dataset epr-labs/no-such-piano-dataset (validation): could not load it")
    assert "dataset=music21" in line


def qa_overrides(data_cache, jsonl) -> list[str]:
    """Text fine-tuning on a JSON-lines file of question/answer rows, with the byte tokenizer."""
    return tiny_overrides(
        data_cache,
        "dataset=json_files",
        f"dataset.files=[{jsonl}]",
        "dataset.tokenizer=byte",
        "dataset.prompt_column=question",
        "dataset.completion_column=answer",
        "loss_masking=finetuning",
        "dataset.max_documents=null",
    )


def test_text_fine_tuning_records_put_the_loss_on_the_completion_only(tmp_path, data_cache):
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a + b}"} for a in range(12) for b in range(12)]
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    overrides = qa_overrides(data_cache, tmp_path / "qa.jsonl")
    parts = build(overrides)
    batch = parts.data.train.batch(0)
    tok = parts.tokenizer
    for inputs, targets, mask in zip(batch["inputs"][0], batch["targets"][0], batch["loss_mask"][0]):
        text = tok.decode(np.r_[inputs[:1], targets])
        prompt, rest = text.split("<GENAI>")
        answer = rest.split("<EOS>")[0]
        assert prompt.startswith("What is") and answer.isdigit()
        assert tok.decode(targets[mask > 0]) == answer + "<EOS>"
    first = [float(parts.step(s)["loss"]) for s in range(30)]
    assert np.mean(first[-5:]) < np.mean(first[:5])


def test_records_whose_prompt_fills_the_context_are_counted_and_a_split_of_only_them_refused(
    tmp_path, data_cache, capsys
):
    """A prompt of context_size tokens or more leaves no completion token in its row: such records trained nothing
    without a word (and a split of nothing else scored a loss over no target)."""
    rows = [
        {"question": f"What is {a} plus {b}?" + " " * 80 * (a == 3), "answer": f"{a + b}"}
        for a in range(8)
        for b in range(8)
    ]
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    overrides = qa_overrides(data_cache, tmp_path / "qa.jsonl")
    data = build(overrides).data
    train = data.train.examples
    counted = [train.batch(train.rows(np.array([i])))["loss_mask"].sum() for i in range(train.num_examples)]
    blind = counted.count(0)
    assert 0 < blind < train.num_examples
    assert f"train {train.num_examples} ({blind} without a target in the context)" in data.summary
    assert (
        f"warning: dataset json_files: {blind} of {train.num_examples} train records have a prompt of "
        "model.context_size=64 tokens or more: no completion token is within their rows, and they train nothing"
    ) in capsys.readouterr().err
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(r) for r in rows if len(r["question"]) >= 64))
    with pytest.raises(DataError, match=r"^dataset json_files: every record of split 'train' has a prompt of model"):
        build(overrides)


def test_sample_asks_a_text_fine_tuned_model_as_its_records_do(tmp_path, data_cache, monkeypatch, capsys):
    """Records are `prompt <GENAI> completion <EOS>`: the tool sent `<EOS> prompt`, without the <GENAI> after which
    the model answers (and which no typed prompt encodes to), so the model went on writing the question."""
    import models.decode

    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a + b}"} for a in range(6) for b in range(6)]
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    finetuning = ["dataset.prompt_column=question", "dataset.completion_column=answer", "loss_masking=finetuning"]
    overrides = tiny_overrides(
        data_cache,
        f"logging.run_dir={tmp_path / 'run'}",
        "dataset=json_files",
        f"dataset.files=[{tmp_path / 'qa.jsonl'}]",
        "dataset.tokenizer=byte",
        "dataset.max_documents=null",
        "train.max_steps=2",
        *finetuning,
    )
    assert run_in_process(overrides, capsys).returncode == 0
    asked = []
    real = models.decode.generate  # as the tool imports it when it runs
    monkeypatch.setattr(
        models.decode,
        "generate",
        lambda model, prompts, *a, **k: asked.append(prompts) or real(model, prompts, *a, **k),
    )
    args = [str(tmp_path / "run"), "--prompt", "What is 3 plus 4?", "--max-new-tokens", "3", "--temperature", "0"]
    result = script_in_process("scripts.tools.sample", args, monkeypatch, capsys)
    assert result.returncode == 0, result.stderr
    tok = build(overrides).tokenizer
    assert asked == [[tok.encode("What is 3 plus 4?") + [tok.genai_id]]]
    assert result.stdout.splitlines()[2].startswith("What is 3 plus 4?<GENAI>")


@pytest.mark.parametrize(
    "override, message",
    [
        (["stage=piano_task", "tasks=[dynamics]"], "config: stage: piano_task needs a notes source"),
        (["dataset=music21", "stage=piano_task"], "config: tasks: stage=piano_task needs at least one task"),
        (["dataset=music21", "stage=piano_task", "tasks=[harmony]"], "config: tasks: unknown task 'harmony'"),
        (["loss_masking=finetuning"], "config: loss_masking: finetuning puts the loss after <GENAI>"),
        (["dataset=music21", "dataset.tokenizer=bpe"], "config: dataset.tokenizer: dataset.source=music21 needs"),
        (
            ["dataset=music21", "dataset.augmentation.max_pitch_shift=-1"],
            "config: dataset.augmentation.max_pitch_shift",
        ),
    ],
)
def test_incoherent_stage_settings_fail_at_the_door(override, message):
    with pytest.raises(ConfigError) as e:
        config_lib.load_config(["model=gpt2-tiny", *override], num_local_devices=1)
    assert str(e.value).startswith(message)


def test_a_stage_error_is_one_line_and_exit_2(capsys):
    result = run_in_process(["model=gpt2-tiny", "stage=piano_task", "tasks=[dynamics]"], capsys)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: config: stage: piano_task needs a notes source (dataset=music21, maestro or midi_files), not pystdlib"
    ]


def test_a_type_2_midi_file_is_one_line_naming_it(tmp_path):
    """mido cannot merge a type 2 file's tracks (independent sequences): its TypeError read as a traceback."""
    from core.errors import DataError
    from data.midi import read_midi

    midi = mido.MidiFile(type=2)
    for pitch in (60, 64):
        track = mido.MidiTrack([mido.Message("note_on", note=pitch), mido.Message("note_off", note=pitch, time=480)])
        midi.tracks.append(track)
    midi.save(tmp_path / "song.mid")
    with pytest.raises(DataError, match=r"song\.mid: a type 2 MIDI file .*; save it as type 0 or 1$"):
        read_midi(tmp_path / "song.mid")
    midi.type = 1  # the same tracks on one timeline read
    midi.save(tmp_path / "song.mid")
    assert len(read_midi(tmp_path / "song.mid").pitch) == 2
