"""Downstream evaluation with lm-eval (training/evaluation/harness.py, models/scoring.py,
scripts/tools/eval_harness.py), offline: the adapter's answers are the model's own losses and greedy tokens, with each
text tokenizer; the script scores local task files the tests write (datasets' `json` builder) on a tiny trained run and
says in one line when lm-eval is missing."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data.tokenizers import BpeTokenizer, ByteTokenizer, Gpt2Tokenizer
from helpers import ROOT, run_cli
from models.config import GPTConfig
from models.decode import generate
from models.gpt import GPT
from models.sampling import generate_no_cache
from training.checkpoints.trained import load_trained
from training.step.losses import token_losses

CONTEXT = 64
CODE = [
    "def main(argv):\n    return 0\n",
    "import os\nimport sys\n",
    "class Point:\n    x: int = 0\n",
    "for i in range(10):\n    print(i)\n",
    "with open(path) as f:\n    text = f.read()\n",
]
# (context, continuation) pairs of many lengths: empty context, a trailing space (lm-eval moves it to the
# continuation), and a context far longer than the model's, which must lose its oldest tokens.
PAIRS = [
    ("def main", "(argv):"),
    ("import os\nimport", " sys"),
    ("", "return 0"),
    ("x = ", "1"),
    ("\n".join(CODE) * 3, "    return x"),
    ("class Point:\n   ", " x: int"),
    (CODE[3], CODE[4]),
]


@pytest.fixture
def lm_eval():
    return pytest.importorskip("lm_eval", reason="lm-eval is an extra: pip install -r requirements-eval.txt")


@pytest.fixture(params=["byte", "bpe", "gpt2"])
def tokenizer(request, monkeypatch):
    if request.param == "byte":
        return ByteTokenizer()
    if request.param == "bpe":
        return BpeTokenizer.train(iter(CODE * 4), 320)  # at most the test model's 320 ids
    # GPT-2's own BPE files cannot be had offline: the project's gpt2 tokenizer around a small byte-level stand-in
    import tiktoken

    ranks = {bytes([b]): b for b in range(256)} | {b"  ": 256, b"    ": 257, b"re": 258, b"return": 259}
    stand_in = tiktoken.Encoding(
        name="gpt2-stand-in",
        pat_str=r"""'s|'t| ?\w+| ?[^\s\w]+|\s+""",
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 260},
    )
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: stand_in)
    return Gpt2Tokenizer()


@functools.cache
def tiny_model() -> GPT:
    """One initialised model for every tokenizer here (its 320 ids cover each one's), so they share compilations."""
    cfg = GPTConfig(vocab_size=320, n_layer=2, n_head=2, n_embd=64, context_size=CONTEXT)
    return GPT.init(cfg, jax.random.PRNGKey(0))


def instances(kind: str, args: list[tuple]) -> list:
    from lm_eval.api.instance import Instance

    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's encoding for causal models: trailing whitespace moves to the continuation, the whole text is encoded
    and split where the context's ids end; an empty context is <EOS>."""
    if not context:
        return [tok.eos_id], tok.encode(continuation)
    stripped = context.rstrip()
    whole, context_ids = tok.encode(context + continuation), tok.encode(stripped)
    return context_ids, whole[len(context_ids) :]


@eqx.filter_jit
def _loss_and_argmax(model: GPT, batch: dict) -> tuple[jax.Array, jax.Array, jax.Array]:
    nll, count = token_losses(model, batch, None, jnp.float32)
    return nll, count, jnp.argmax(model(batch["inputs"]), axis=-1)


def own_loss(model: GPT, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """-(the training loss code's summed loss over the continuation) on the last context+1 tokens of the text, and
    whether the model's argmax is the target at every continuation position. (One padded shape, one compilation:
    padding sits after the text and outside the loss mask.)"""
    window = (context + continuation)[-(CONTEXT + 1) :]
    n = len(window) - 1
    inputs, targets, mask = np.zeros((3, 1, CONTEXT), np.int32)
    inputs[0, :n], targets[0, :n], mask[0, n - len(continuation) : n] = window[:-1], window[1:], 1
    nll, count, argmax = _loss_and_argmax(model, {"inputs": inputs, "targets": targets, "loss_mask": mask})
    assert int(count) == len(continuation)
    scored = mask[0].astype(bool)
    return -float(nll), bool(np.all(np.asarray(argmax)[0][scored] == targets[0][scored]))


def test_loglikelihood_is_the_models_own_loss_and_greedy_is_its_argmax(lm_eval, tokenizer):
    from training.evaluation.harness import harness_lm

    model = tiny_model()
    lm = harness_lm(model, tokenizer)
    answers = lm.loglikelihood(instances("loglikelihood", PAIRS))
    expected = [own_loss(model, *encode_pair(tokenizer, c, k)) for c, k in PAIRS]
    assert len(tokenizer.encode(PAIRS[4][0])) > CONTEXT  # the long context really is cut
    # two programs (the harness's batch, the model's own loss): sums of up to 64 float32 log-probs, ~1e-6 each
    np.testing.assert_allclose([a[0] for a in answers], [e[0] for e in expected], rtol=1e-5, atol=1e-4)
    assert [a[1] for a in answers] == [e[1] for e in expected]
    # The model's own greedy continuations (full-window decoding, no cache) are greedy; one token off is not.
    prompts = [ids for ids in (tokenizer.encode(c) for c, _ in PAIRS) if 0 < len(ids) <= CONTEXT - 6]
    greedy = generate_no_cache(model, prompts, 6, temperature=0.0)
    wrong = [g[:-1] + [(g[-1] + 1) % tokenizer.vocab_size] for g in greedy]
    scored = lm._loglikelihood_tokens([(None, p, g) for p, g in zip(prompts + prompts, greedy + wrong)])
    assert [s[1] for s in scored] == [True] * len(prompts) + [False] * len(prompts)


def test_an_answer_longer_than_the_context_or_empty_is_one_line(lm_eval, tokenizer):
    """A multiple-choice answer of more tokens than the model's context (bytes of a long hellaswag ending) was a
    ValueError traceback from models/scoring.py through lm-eval."""
    from core.errors import DataError
    from training.evaluation.harness import harness_lm

    lm = harness_lm(tiny_model(), tokenizer)
    long = [(None, [1, 2], list(range(CONTEXT + 1)))]
    with pytest.raises(DataError, match=rf"^lm-eval: a task's answer is {CONTEXT + 1} tokens, more than the model's"):
        lm._loglikelihood_tokens(long)
    with pytest.raises(DataError, match=r"^lm-eval: a task's answer is empty"):
        lm._loglikelihood_tokens([(None, [1, 2], [])])


def test_batching_does_not_change_the_answers(lm_eval, tokenizer):
    from training.evaluation.harness import harness_lm

    model = tiny_model()
    requests = instances("loglikelihood", PAIRS * 3)
    one_by_one = harness_lm(model, tokenizer, batch_tokens=1).loglikelihood(requests)  # one row per call
    batched = harness_lm(model, tokenizer).loglikelihood(requests)  # every request of a length in one call
    # other batch shapes compile other programs: a few ulp of sums of log-probs (~1e-6); atol 1e-5
    np.testing.assert_allclose([a[0] for a in batched], [a[0] for a in one_by_one], rtol=1e-6, atol=1e-5)
    assert [a[1] for a in batched] == [a[1] for a in one_by_one]


def test_rolling_loglikelihood_predicts_every_token_once_in_full_windows(lm_eval, tokenizer):
    """lm-eval's perplexity protocol: <EOS> then the first tokens; past the context, each window has the model's
    whole context and scores only the tokens not scored yet."""
    from training.evaluation.harness import harness_lm

    model = tiny_model()
    texts = ["".join(CODE) * 6, CODE[0], ""]
    ids = tokenizer.encode(texts[0])
    assert len(ids) > 3 * CONTEXT
    expected, predicted = own_loss(model, [tokenizer.eos_id], ids[:CONTEXT])[0], CONTEXT
    while predicted < len(ids):
        end = min(predicted + CONTEXT, len(ids))
        window = ids[end - CONTEXT - 1 : end]  # a whole context of inputs, scored on the tokens not scored yet
        expected += own_loss(model, window[: predicted - end], window[predicted - end :])[0]
        predicted = end
    short = own_loss(model, [tokenizer.eos_id], tokenizer.encode(texts[1]))[0]
    answers = harness_lm(model, tokenizer, batch_tokens=256).loglikelihood_rolling(
        instances("loglikelihood_rolling", [(t,) for t in texts])
    )
    # rolling windows summed in float32 by the harness, in float64 here, over a few hundred tokens: ~1e-4 at most
    np.testing.assert_allclose(answers, [expected, short, 0.0], rtol=1e-5, atol=1e-3)


def test_a_task_whose_data_cannot_be_had_offline_is_one_line(lm_eval, tmp_path, monkeypatch):
    from core.errors import DataError
    from training.evaluation.harness import evaluate_tasks, harness_lm

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))  # nothing cached: the Hub would be asked
    (tmp_path / "hub_task.yaml").write_text(
        "task: hub_task\ndataset_path: someone/not-cached\n"
        "output_type: loglikelihood\ntest_split: test\n"
        'doc_to_text: "{{text}}"\ndoc_to_target: "{{answer}}"\n'
    )
    with pytest.raises(DataError) as error:
        evaluate_tasks(harness_lm(tiny_model(), ByteTokenizer()), ["hub_task"], include_path=str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and "someone/not-cached" in message and "Offline?" in message


@pytest.fixture(scope="module")
def trained(tmp_path_factory, finished):
    """A copy of the suite's tiny run (bytes, gpt2-tiny, checkpoints at steps 4 and 8): the script writes into the
    run it is given, the copy, and never into the run the copy was made from (whose checkpoints record its path)."""
    run_dir = tmp_path_factory.mktemp("harness") / "run"
    shutil.copytree(finished, run_dir)
    return run_dir


def test_generation_is_greedy_decoding_cut_at_the_first_stop_string(lm_eval):
    from training.evaluation.harness import harness_lm

    tok = ByteTokenizer()
    model = GPT.init(
        GPTConfig(vocab_size=tok.vocab_size, n_layer=2, n_head=2, n_embd=64, context_size=CONTEXT),
        jax.random.PRNGKey(0),
    )
    # Freshly initialised, the tied embedding makes every greedy text one repeated byte; blocks 5x larger do not.
    model = eqx.tree_at(lambda m: m.blocks, model, jax.tree.map(lambda w: 5 * w, model.blocks))
    contexts = ["def main(", "import os\nimport sys\n", "class A:\n    def", ""]
    alone = [
        generate(model, [tok.encode(c) or [tok.eos_id]], 16, temperature=0.0, eos_id=tok.eos_id)[0] for c in contexts
    ]
    assert all(tok.eos_id not in ids for ids in alone)
    texts = [tok.decode(ids) for ids in alone]
    # Stop strings greedy decoding does produce, each first after a few characters of one text (a character new at
    # that point and in no text's first three); the four prompts share them, so they decode together in one batch.
    heads = "".join(t[:3] for t in texts)
    stops = [next(t[k] for k in range(3, len(t)) if t.find(t[k]) == k and t[k] not in heads) for t in texts]
    requests = [(c, {"until": stops, "max_gen_toks": 16, "do_sample": False}) for c in contexts]
    requests.append((contexts[0], {"until": ["never in the text"], "max_gen_toks": 5}))
    answers = harness_lm(model, tok).generate_until(instances("generate_until", requests))
    expected = [t[: min(t.find(s) for s in stops if s in t)] for t in texts]
    assert answers[:4] == expected and all(3 <= len(e) < len(t) for e, t in zip(expected, texts))
    assert answers[4] == tok.decode(alone[0][:5])  # max_gen_toks: the first 5 greedy tokens


def write_tasks(folder, lm, tok) -> dict:
    """Three local tasks (multiple choice, perplexity, generation) as lm-eval task YAMLs over JSONL files; returns
    what the adapter itself answers, to compare with what the script reports."""
    folder.mkdir()
    docs = []
    for i, (text, ending) in enumerate(
        [
            ("def main", "(argv):"),
            ("import", "os"),
            ("for i in", "range(3):"),
            ("class", "Point:"),
            ("return", "None"),
            ("with open(", "path) as f:"),
        ]
    ):
        choices = [ending, "banana split", "7 7 7"]
        scores = [ll for ll, _ in lm.loglikelihood(instances("loglikelihood", [(text, " " + c) for c in choices]))]
        preferred = choices.pop(int(np.argmax(scores)))
        choices.insert(i % 3, preferred)  # the model's choice sits at every position in turn: acc 1 means it is read
        docs.append({"text": text, "choices": choices, "label": i % 3})
    pages = [{"page": c} for c in CODE]
    rolling = lm.loglikelihood_rolling(instances("loglikelihood_rolling", [(c,) for c in CODE]))
    common = "dataset_path: json\ntest_split: test\ndataset_kwargs:\n  data_files:\n    test: {file}\n"
    tasks = {
        "tiny_choice": (
            "multiple_choice",
            docs,
            'doc_to_text: "{{text}}"\ndoc_to_target: "{{label}}"\n'
            'doc_to_choice: "{{choices}}"\nmetric_list:\n  - metric: acc\n',
        ),
        "tiny_pages": (
            "loglikelihood_rolling",
            pages,
            'doc_to_text: ""\ndoc_to_target: "{{page}}"\nmetric_list:\n  - metric: bits_per_byte\n',
        ),
        "tiny_answer": (
            "generate_until",
            docs,
            'doc_to_text: "{{text}}"\ndoc_to_target: "{{choices[label]}}"\n'
            'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 8\n  do_sample: false\n'
            "metric_list:\n  - metric: exact_match\n",
        ),
    }
    for name, (kind, rows, body) in tasks.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        header = f"task: {name}\noutput_type: {kind}\n" + common.format(file=folder / f"{name}.jsonl")
        (folder / f"{name}.yaml").write_text(header + body)
    return {"acc": 1.0, "bits_per_byte": -sum(rolling) / sum(len(c.encode()) for c in CODE) / math.log(2)}


@pytest.mark.e2e
@pytest.mark.soak
def test_script_writes_lm_evals_results_beside_the_run_and_logs_them(lm_eval, trained, finished, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from training.evaluation.harness import harness_lm

    run = load_trained(str(trained))
    expected = write_tasks(tmp_path / "tasks", harness_lm(run.model, run.tokenizer), run.tokenizer)
    args = [str(trained), "--tasks", "tiny_choice,tiny_pages,tiny_answer", "--include-path", str(tmp_path / "tasks")]
    env = {"HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets")}
    done = run_cli(args, timeout=240, env=env, module="scripts.tools.eval_harness")
    assert done.returncode == 0, done.stderr[-3000:]
    out = trained / "harness" / "step8-tiny_choice+tiny_pages+tiny_answer.json"
    record = json.loads(out.read_text())
    assert record["step"] == 8 and record["command"].startswith("python -m scripts.tools.eval_harness ")
    results = record["results"]
    assert results["tiny_choice"]["acc,none"] == expected["acc"]
    assert results["tiny_pages"]["bits_per_byte,none"] == pytest.approx(expected["bits_per_byte"], rel=1e-5)
    assert 0.0 <= results["tiny_answer"]["exact_match,none"] <= 1.0
    assert "tiny_choice" in done.stdout and str(out) in done.stdout  # lm-eval's table and where it went
    events = EventAccumulator(str(trained / "tensorboard"))
    events.Reload()
    logged = events.Scalars("harness/tiny_choice/acc")
    assert [(e.step, e.value) for e in logged] == [(8, 1.0)]
    assert not (finished / "harness").exists()  # the run the copy was made from, recorded in its checkpoints


@pytest.mark.e2e
def test_script_without_lm_eval_says_how_to_install_it_and_exits_2(trained, tmp_path):
    shadow = tmp_path / "shadow" / "lm_eval"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'lm_eval'\")\n")
    env = {"PYTHONPATH": os.pathsep.join([str(shadow.parent), str(ROOT)])}
    done = run_cli([str(trained), "--tasks", "hellaswag"], timeout=120, env=env, module="scripts.tools.eval_harness")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "error: lm-eval is not installed (No module named 'lm_eval'): pip install -r requirements-eval.txt"
    ]
    assert done.stdout == "" and not (trained / "harness" / "step8-hellaswag.json").exists()


def test_an_out_that_is_a_directory_is_one_line_before_the_model_is_evaluated(trained, tmp_path, monkeypatch, capsys):
    from helpers import script_in_process

    args = [str(trained), "--tasks", "hellaswag", "--out", str(tmp_path)]
    done = script_in_process("scripts.tools.eval_harness", args, monkeypatch, capsys)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"error: --out: {tmp_path} is a directory; name a file in it"
    ], done.stderr
    assert list(tmp_path.iterdir()) == []
    # a file of the run's own, which a rerun's "replace the results" overwrote with them
    config = (trained / "config.yaml").read_text()
    args = [str(trained), "--tasks", "hellaswag", "--out", str(trained / "config.yaml")]
    done = script_in_process("scripts.tools.eval_harness", args, monkeypatch, capsys)
    assert done.returncode == 2 and done.stderr == (
        f"error: --out: {trained / 'config.yaml'} exists and is not an eval_harness result; name a new file\n"
    )
    assert (trained / "config.yaml").read_text() == config


def test_the_results_file_is_named_by_what_sets_the_numbers():
    """A bfloat16 or another seed's evaluation replaced the float32 one of the same step and tasks."""
    import argparse
    from types import SimpleNamespace

    from scripts.tools.eval_harness import results_name

    def name(**given):
        args = {"num_fewshot": None, "limit": None, "dtype": "float32", "seed": 0, **given}
        return results_name(SimpleNamespace(step=8), ["hellaswag", "lambada_openai"], argparse.Namespace(**args))

    assert name() == "step8-hellaswag+lambada_openai.json"
    assert name(num_fewshot=5, limit=0.5, dtype="bfloat16", seed=3) == (
        "step8-hellaswag+lambada_openai-5shot-limit0.5-bfloat16-seed3.json"
    )
    assert len({name(), name(dtype="bfloat16"), name(seed=1)}) == 3
    # twelve MMLU subjects: a name over the file system's 255 bytes was a traceback (OSError: File name too long)
    subjects = [
        f"mmlu_{s}" for s in ("abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge")
    ]
    subjects += [f"mmlu_college_{s}" for s in ("biology", "chemistry", "computer_science", "mathematics", "medicine")]
    subjects += ["mmlu_college_physics", "mmlu_computer_security"]
    default = argparse.Namespace(num_fewshot=None, limit=0.5, dtype="float32", seed=0)
    long = results_name(SimpleNamespace(step=8), subjects, default)
    assert long.startswith("step8-mmlu_abstract_algebra+11more-") and long.endswith("-limit0.5.json"), long
    assert len(long) < 100 and long != results_name(SimpleNamespace(step=8), subjects[:-1] + ["mmlu_virology"], default)
