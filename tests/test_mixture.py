"""dataset.mixture: rows drawn from several sources by weight, a pure function of (seed, step, process); evaluation
per source; tokens seen per source; exact resume."""

import numpy as np
import pytest

from core.errors import ConfigError
from data.batches import EvalBatches, TrainBatches, allot
from data.examples import Windows
from data.mixture import MIXTURE_BLOCK, MixtureTrainBatches
from helpers import ROOT, read_metrics, run_cli, tiny_overrides
from training.config import load_config, mixture_sources

PAD = 257


def sources(n_sources=3, context=16):
    """Source s's tokens all equal s (so a window says where it came from), lengths that differ."""
    return [np.full(context * (40 + 13 * s) + 1, s, np.uint16) for s in range(n_sources)]


def mixture(weights, batch_size=8, accum=1, process=0, processes=1, seed=0, context=16):
    trains = [
        TrainBatches(Windows(t, context, PAD), batch_size, accum, process, processes, (seed, i))
        for i, t in enumerate(sources(len(weights), context))
    ]
    return MixtureTrainBatches(
        [f"s{i}" for i in range(len(weights))], weights, trains, batch_size, accum, process, processes, seed
    )


def test_allot_rounds_to_the_total_in_proportion():
    assert allot([0.7, 0.2, 0.1], 10) == [7, 2, 1]
    assert allot([1, 1, 1], 4096) == [1366, 1365, 1365]
    assert sum(allot([0.123, 0.456, 0.421], 4096)) == 4096


def test_every_block_gives_each_source_its_share_exactly():
    mix = mixture([0.7, 0.2, 0.1])
    source, _ = mix.assign(np.arange(3 * MIXTURE_BLOCK))
    for b in range(3):
        counts = np.bincount(source[b * MIXTURE_BLOCK : (b + 1) * MIXTURE_BLOCK], minlength=3)
        assert counts.tolist() == allot([0.7, 0.2, 0.1], MIXTURE_BLOCK)
    assert not np.array_equal(source[:MIXTURE_BLOCK], source[MIXTURE_BLOCK : 2 * MIXTURE_BLOCK])  # shuffled per block


def test_each_source_reads_its_own_samples_in_order_without_gaps():
    mix = mixture([0.5, 0.3, 0.2])
    source, local = mix.assign(np.arange(2 * MIXTURE_BLOCK + 100))
    for s in range(3):
        assert np.array_equal(np.sort(local[source == s]), np.arange(np.sum(source == s)))


def test_batches_are_a_pure_function_of_seed_step_and_process():
    a, b = mixture([0.6, 0.4]), mixture([0.6, 0.4])
    for step in (0, 7, 700):  # step 700: past the first block of 4096 rows
        np.testing.assert_array_equal(a.batch(step)["inputs"], b.batch(step)["inputs"])
    assert not np.array_equal(a.batch(3)["inputs"], mixture([0.6, 0.4], seed=1).batch(3)["inputs"])
    # Two processes' halves are the one-process batch; so are accumulated micro-batches.
    whole = mixture([0.6, 0.4], batch_size=8).batch(5)["inputs"]
    halves = [mixture([0.6, 0.4], batch_size=4, process=p, processes=2).batch(5)["inputs"] for p in range(2)]
    np.testing.assert_array_equal(np.concatenate(halves, axis=1), whole)
    micro = mixture([0.6, 0.4], batch_size=4, accum=2).batch(5)["inputs"]
    np.testing.assert_array_equal(micro.reshape(1, 8, 16), whole)


def test_rows_come_from_the_drawn_source_and_tokens_seen_counts_them():
    mix = mixture([0.7, 0.2, 0.1])
    seen = np.zeros(3, np.int64)
    for step in range(600):  # 4800 rows: past one block
        rows = mix.batch(step)["inputs"][0, :, 0]  # a window's tokens say which source it came from
        seen += np.bincount(rows, minlength=3)
        assert mix.tokens_seen(step + 1) == {f"s{i}": int(n) * 16 for i, n in enumerate(seen)}
    share = seen / seen.sum()
    np.testing.assert_allclose(share, [0.7, 0.2, 0.1], atol=0.01)


def test_the_block_cache_cleared_by_another_thread_between_lookup_and_read_loses_no_block():
    """The prefetch thread (batch) and the loop's (tokens_seen) share the cache of blocks, which each clears when it
    holds more than eight: a clear between one thread's lookup and its read was a KeyError in the other. Here every
    lookup is followed at once by another thread's clear."""

    class ClearedAfterEachLookup(dict):
        def __contains__(self, key):
            found = super().__contains__(key)
            self.clear()
            return found

        def get(self, key, default=None):
            found = super().get(key, default)
            self.clear()
            return found

    reference, mix = mixture([0.6, 0.4]), mixture([0.6, 0.4])
    mix._blocks = ClearedAfterEachLookup()
    for step in (3, 3, 700, 700):  # each block looked up once built, then again when cached
        np.testing.assert_array_equal(mix.batch(step)["inputs"], reference.batch(step)["inputs"])
        assert mix.tokens_seen(step) == reference.tokens_seen(step)


def test_a_mixed_evaluation_set_takes_each_sources_share_of_windows():
    a, b = sources(2)
    ev = EvalBatches(
        [Windows(a, 16, PAD), Windows(b, 16, PAD)], 4, num_batches=4, process_index=0, process_count=1, weights=[3, 1]
    )
    firsts = np.concatenate([batch["inputs"][:, 0] for batch in ev])
    assert np.bincount(firsts, minlength=2).tolist() == [12, 4]
    # a source shorter than its share (b: 5 windows for 16 of 64 rows) shrinks both shares: it was all of b and
    # a's full 48, a 48 / 5 set for weights 3 / 1
    a, b = np.full(16 * 200 + 1, 0, np.uint16), np.full(16 * 5 + 1, 1, np.uint16)
    ev = EvalBatches([Windows(a, 16, PAD), Windows(b, 16, PAD)], 4, 16, 0, 1, weights=[3, 1])
    real = np.concatenate([batch["inputs"][batch["loss_mask"].sum(-1) > 0, 0] for batch in ev])
    assert np.bincount(real, minlength=2).tolist() == [15, 5]
    # one split shorter than the set: all of it (int(22 * 15 / 22) is 14)
    assert EvalBatches(Windows(np.full(16 * 15 + 1, 0, np.uint16), 16, PAD), 2, 11, 0, 1).num_examples == 15


@pytest.mark.e2e
def test_a_mixture_run_evaluates_each_source_and_resumes_bitwise(data_cache, tmp_path):
    """Two sources (the standard library and this repository's text files). Resumed from its step-3 checkpoint,
    the run logs the same losses and tokens per source, bit for bit, as it did the first time."""
    run_dir = tmp_path / "run"
    mix = tiny_overrides(
        data_cache,
        "dataset=mixture",
        "dataset.tokenizer=byte",
        "dataset.mixture=[{dataset: pystdlib, weight: 3, name: code, max_documents: 24},"
        f" {{dataset: text_files, weight: 1, name: docs, files: [{ROOT}/README.md, {ROOT}/BENCHMARKS.md, {ROOT}/conf/],"
        " val_fraction: 0.3, test_fraction: 0}]",
        "dataset.context_size=32",
        "train.max_steps=6",
        "train.eval_interval=3",
        "checkpoint.save_steps=3",
        "train.batch_size=4",
        f"logging.run_dir={run_dir}",
    )
    r = run_cli(mix)
    assert r.returncode == 0, r.stderr[-2000:]
    first = read_metrics(run_dir)
    r = run_cli(
        [
            *mix,
            "checkpoint.load=True",
            f"checkpoint.load_path={run_dir}",
            "checkpoint.load_file=3",
            "checkpoint.save=false",
        ]
    )
    assert r.returncode == 0, r.stderr[-2000:]
    again = [row for row in read_metrics(run_dir) if row["step"] > 3]  # the first run's rows past 3 were set aside

    def train_rows(rows):
        return {
            row["step"]: {k: v for k, v in row.items() if k.startswith(("loss", "tokens_seen"))}
            for row in rows
            if row["split"] == "train"
        }

    want, got = train_rows(first), train_rows(again)
    assert sorted(got) == [4, 5, 6] and all(got[s] == want[s] for s in got)  # floats compared exactly
    assert got[6]["tokens_seen/code"] + got[6]["tokens_seen/docs"] == 6 * 4 * 32 == got[6]["tokens_seen"]
    assert got[6]["tokens_seen/code"] > got[6]["tokens_seen/docs"] > 0
    splits = {row["split"] for row in first if row["step"] == 6} - {"train"}
    assert splits == {"val", "code/val", "code/email", "code/asyncio", "code/json", "docs/val"}


@pytest.mark.parametrize(
    "override,named",
    [
        ("dataset.mixture=[{dataset: pystdlib, weight: 0}]", "dataset.mixture[0].weight"),
        ("dataset.mixture=[{dataset: nowhere, weight: 1}]", "dataset.mixture[0].dataset"),
        ("dataset.mixture=[{dataset: pystdlib}]", "dataset.mixture[0]"),
        ("dataset.mixture=[{dataset: pystdlib, weight: 1, tokenizer: gpt2}]", "dataset.mixture[0].tokenizer"),
        ("dataset.mixture=[{dataset: pystdlib, weight: 1, no_such_key: 3}]", "dataset.mixture[0]"),
        ("dataset.mixture=[{dataset: pystdlib, weight: 1}, {dataset: pystdlib, weight: 1}]", "dataset.mixture[1].name"),
        ("dataset.mixture=[{dataset: music21, weight: 1}]", "dataset.mixture[0].dataset"),
        ("dataset.mixture=[{dataset: text_files, weight: 1}]", "dataset.mixture[0].files"),
        (
            "dataset.mixture=[{dataset: pystdlib, weight: 1}, {dataset: text_files, weight: 1e-6, files: [x]}]",
            "dataset.mixture",
        ),
        ("dataset.val_fraction=0.2", "dataset.val_fraction"),  # each source holds out its own: it would reach none
        # the rows of one batch share a context and a masking: an entry's own was ignored (source 0's cut every row)
        ("dataset.mixture=[{dataset: pystdlib, weight: 1, context_size: 8}]", "dataset.mixture[0].context_size"),
        ("dataset.mixture=[{dataset: pystdlib, weight: 1, document_mask: true}]", "dataset.mixture[0].document_mask"),
    ],
)
def test_a_bad_mixture_is_one_config_error_naming_the_entry(override, named):
    with pytest.raises(ConfigError) as e:
        load_config(["dataset=mixture", "dataset.tokenizer=byte", override], num_local_devices=1)
    assert f"config: {named}" in str(e.value) and "\n" not in str(e.value)


def test_the_runs_cap_and_document_cutting_reach_every_source_unless_an_entry_sets_its_own():
    """dataset.max_documents (a quick run's cap), document_starts and max_document_tokens, set on the run, are each
    source's: they were dropped, so a mixture read every document of its sources."""
    mixture = (
        "dataset.mixture=[{dataset: pystdlib, weight: 1, name: a}, "
        "{dataset: pystdlib, weight: 1, name: b, max_documents: 5}]"
    )
    run = ["dataset.max_documents=24", "dataset.document_starts=true", "dataset.max_document_tokens=64"]
    cfg = load_config(["dataset=mixture", "dataset.tokenizer=byte", mixture, *run], num_local_devices=1)
    got = {
        name: (s.max_documents, s.document_starts, s.max_document_tokens) for name, _, s in mixture_sources(cfg.dataset)
    }
    assert got == {"a": (24, True, 64), "b": (5, True, 64)}


def test_a_mixture_without_source_mixture_is_refused():
    """The dataset section is its source's: pystdlib's has no mixture key, and the line says which source reads it."""
    with pytest.raises(ConfigError) as refused:
        load_config(["dataset.mixture=[{dataset: pystdlib, weight: 1}]"], num_local_devices=1)
    assert str(refused.value) == (
        "config: unknown key 'dataset.mixture' (python train_jax.py --cfg lists every key); read by dataset=mixture "
        "(pick the source with dataset=...)"
    )
