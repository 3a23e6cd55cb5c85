"""The init_* functions in the order a run calls them, and `build`, which calls them all:

    check_builders -> mesh -> corpus -> init_tokenizer -> load_data -> init_model -> init_scheduler -> init_optimizer
         -> init_state_and_steps (the train state on the mesh, its shardings, the compiled train and eval steps)

A run that starts from a checkpoint (`source`) keeps the checkpoint's tokenizer. Scripts that need a part without a
corpus (benchmarks, memory estimates) call the init_* functions they need; everything else calls `build`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import optax
from jax.sharding import Mesh

from core.errors import DataError
from data import Data, make_data
from data.corpus import load_corpus
from data.notes_tokenizer import notes_tokenizer
from data.sources import MixtureCorpus, TextCorpus
from data.tokenizers import Tokenizer, build_tokenizer, tokenizer_from_json
from models import MODEL_BUILDERS
from models.gpt import GPT
from optimizers import (
    build_optimizer,
    build_schedule,
    geometry_groups,
    lr_multipliers,
    lr_schedule_of,
)
from training import config as config_lib
from training.checkpoints.resume import Source
from training.config import Config
from training.config.stages import batch_sizes, final_model, lr_multiplier_at, model_config_at, plan_stages
from training.distributed.sharding import init_mesh, state_shardings
from training.evaluation.splits import evaluate
from training.step.eval_step import make_eval_step
from training.step.precision import compute_dtype, fp8_recipe
from training.step.state import TrainState, place_state
from training.step.stats import StatsKnobs
from training.step.train_step import TrainStep, make_train_step

Corpus = TextCorpus | MixtureCorpus | dict  # load_corpus's: text, a mixture, or {split: datasets.Dataset} of notes
Results = dict[str, dict[str, float]]  # split -> loss, perplexity, tokens (and nats/bits per byte for text)


def init_tokenizer(cfg: Config, corpus: Corpus, source: Source | None, process_index: int | None = None) -> Tokenizer:
    """A run that starts from a checkpoint keeps the checkpoint's tokenizer: its ids are what the weights learned.
    `process_index` (default: JAX's) for a caller that must not start JAX's backend (a script making the data its
    runs will read)."""
    d = cfg.dataset
    if source is not None:
        tokenizer = tokenizer_from_json(source.meta["tokenizer"])
        if "notes" in (tokenizer.kind, d.tokenizer) and tokenizer.kind != d.tokenizer:  # no setting makes them meet
            theirs, ours = (
                ("notes", f"text ({d.tokenizer})") if tokenizer.kind == "notes" else (tokenizer.kind, "notes")
            )
            raise DataError(
                f"dataset.tokenizer: the checkpoint's model reads {theirs}, this run's data is {ours}: start it from "
                f"a checkpoint of a {ours.split()[0]} run, or from fresh weights"
            )
        if tokenizer.kind != d.tokenizer:
            raise DataError(
                f"dataset.tokenizer: {d.tokenizer} does not match the checkpoint's "
                f"{tokenizer.kind}; set dataset.tokenizer={tokenizer.kind}"
            )
        if tokenizer.kind == "notes" and tokenizer.to_json() != notes_tokenizer(d).to_json():
            raise DataError(
                f"dataset.notes_tokenizer: {notes_tokenizer(d).to_json()} does not match the "
                f"checkpoint's {tokenizer.to_json()}; use the checkpoint's settings"
            )
        return tokenizer
    if d.tokenizer == "notes":
        return notes_tokenizer(d)
    return build_tokenizer(
        d.tokenizer,
        bpe_vocab_size=d.bpe_vocab_size,
        train_texts=corpus.train_texts,
        corpus_fingerprint=corpus.fingerprint,
        cache_dir=d.cache_dir,
        process_index=jax.process_index() if process_index is None else process_index,
        wait_s=d.build_timeout_s,
    )


def load_data(cfg: Config, corpus: Corpus, tokenizer: Tokenizer, processes: tuple[int, int] | None = None) -> Data:
    """`processes`: (index, count), JAX's by default (see init_tokenizer)."""
    sizes = batch_sizes(plan_stages(cfg))  # the batch grows with train.stages
    context = config_lib.context_size(cfg)
    index, count = (jax.process_index(), jax.process_count()) if processes is None else processes
    return make_data(cfg, corpus, tokenizer, context, index, count, sizes)


def init_model(cfg: Config, vocab_size: int, key: jax.Array, mesh: Mesh | None = None) -> GPT:
    """The model the run ends with (train.stages' last attention window); earlier stages read it under their own
    window (training/config/stages.py). On `mesh`, made in its layout (`model_maker`); without one, on the default
    device."""
    return model_maker(cfg, vocab_size, mesh)(key)


def model_maker(cfg: Config, vocab_size: int, mesh: Mesh | None = None) -> Callable[[jax.Array], GPT]:
    """key -> the fresh model. On `mesh`: one program whose every array comes out in its share of the run's layout
    (system.sharding, the model's tensor-parallel axes), so no device ever holds the whole model, only its share and
    the random bits of it (JAX's partitionable threefry draws the same numbers however the arrays are split)."""
    builder, options = MODEL_BUILDERS[cfg.model.arch], final_model(cfg)

    def make(key: jax.Array) -> GPT:
        return builder(options, vocab_size, key)

    if mesh is None:
        return make
    abstract = eqx.filter_eval_shape(make, jax.random.PRNGKey(0))
    shardings = state_shardings(abstract, mesh, cfg.system.sharding)
    found = (builder, jax.tree.structure(abstract), *jax.tree.leaves(abstract), *jax.tree.leaves(shardings))
    if found not in _MADE_IN_LAYOUT:
        if len(_MADE_IN_LAYOUT) >= 16:
            _MADE_IN_LAYOUT.clear()
        _MADE_IN_LAYOUT[found] = eqx.filter_jit(lambda key: eqx.filter_shard(make(key), shardings))
    return _MADE_IN_LAYOUT[found]


# model_maker's programs on a mesh, by builder, the model's structure (its static fields: a builder's model keeps every
# option its init read, e.g. models/__init__.py's GPTConfig), shapes and shardings: a process that makes the same
# model in the same layout again (an in-process sweep's jobs, a notebook, the test suite) calls the program it has,
# instead of tracing and lowering it again (0.5 s for gpt2-tiny's; BENCHMARKS.md "Start-up of a short run, and how
# the test suite compiles").
_MADE_IN_LAYOUT: dict[tuple, Callable[[jax.Array], GPT]] = {}


def init_scheduler(cfg: Config) -> optax.Schedule:
    """The lr at each update count (optimizer.lr_config). train.stages' lr multipliers follow the step, not the
    update count (a skipped step applies no update): the train step applies them (init_state_and_steps)."""
    return build_schedule(cfg.optimizer.lr_config, config_lib.schedule_steps(cfg))


def init_optimizer(cfg: Config, schedule: optax.Schedule, model: GPT) -> optax.GradientTransformation:
    # the run's optimizer steps: a method's own warmups below 1 are fractions of them (optimizers/groups.py)
    steps = config_lib.schedule_steps(cfg)
    return build_optimizer(cfg.optimizer, schedule, model, cfg.train.grad_accum_steps, run_steps=steps)


EvalStep = Callable[[GPT, dict[str, jax.Array]], tuple[jax.Array, jax.Array, jax.Array]]


def state_options(cfg: Config, model: GPT) -> tuple[Any, StatsKnobs, Any]:
    """What besides the model and optimizer makes the run's TrainState (`TrainState.create`'s dtype, knobs, fp8):
    the compute dtype's loss scale, the statistics' buffers (logging.store_*_grads, update_geometry), FP8's scales.
    Tools that size or compile the state from abstract shapes take it here too, so they size the state a run has."""
    knobs = StatsKnobs.from_cfg(cfg.logging, geometry_groups(cfg.optimizer, model))
    return compute_dtype(cfg.system.dtype), knobs, fp8_recipe(cfg.system)


def init_state_and_steps(
    cfg: Config,
    model: GPT,
    schedule: optax.Schedule,
    optimizer: optax.GradientTransformation,
    key: jax.Array,
    mesh: Mesh,
) -> tuple[TrainState, Any, TrainStep, EvalStep]:
    """The train state on the mesh, its shardings (a TrainState-shaped tree of NamedSharding), and the train and eval
    steps for the run's precision."""
    dtype, knobs, fp8 = state_options(cfg, model)
    state, shardings = place_state(model, optimizer, key, mesh, cfg.system.sharding, dtype, knobs, fp8)
    train_step = make_train_step(
        optimizer,
        lr_schedule_of(cfg.optimizer, schedule),
        shardings,
        dtype,
        cfg.train.skip_nonfinite,
        knobs=knobs,
        z_loss=cfg.train.z_loss,
        lr_multipliers=lr_multipliers(cfg.optimizer),
        model_config_at=model_config_at(cfg, model.cfg),
        stage_lr_multiplier=lr_multiplier_at(plan_stages(cfg)),
    )
    return state, shardings, train_step, make_eval_step(dtype)


@dataclass
class Pipeline:
    """What the init_* functions make: everything the loop needs."""

    mesh: Mesh
    tokenizer: Tokenizer
    data: Data
    schedule: optax.Schedule
    optimizer: optax.GradientTransformation
    state: TrainState
    shardings: Any  # a TrainState-shaped tree of NamedSharding
    train_step: TrainStep
    eval_step: EvalStep

    def evaluate(self, model: GPT, splits: dict[str, Any] | None = None) -> Results:
        """`model` on `splits` (by default every validation split): one table of results per split."""
        return evaluate(
            self.eval_step, model, self.data.evals if splits is None else splits, self.mesh, self.data.token_bytes
        )


def check_builders(cfg: Config) -> None:
    """The model's, schedule's and optimizer's builders check options the config's schema cannot (a group's
    `ns_steps: 0`, a value only its optimizer needs): run them on the model's shapes (no array is made, milliseconds
    even for gpt2-xl), so that such a value is refused before the corpus loads and tokenises, not after. The
    vocabulary is a stand-in: only the data gives the real one, and it is a shape to the builders, never checked."""
    abstract = eqx.filter_eval_shape(model_maker(cfg, _STAND_IN_VOCAB), jax.random.PRNGKey(0))
    init_optimizer(cfg, init_scheduler(cfg), abstract)


_STAND_IN_VOCAB = 256


def build(cfg: Config, source: Source | None = None) -> Pipeline:
    """The init_* functions in order, on a mesh, with a fresh train state and the compiled-on-first-call steps. The
    builders' own checks first (`check_builders`): nothing loads for a run they would refuse."""
    check_builders(cfg)
    mesh = init_mesh(cfg.system.num_devices, cfg.system.mesh_model)
    corpus = load_corpus(cfg.dataset, config_lib.mixture_sources(cfg.dataset))
    tokenizer = init_tokenizer(cfg, corpus, source)
    data = load_data(cfg, corpus, tokenizer)
    model_key, train_key = jax.random.split(jax.random.PRNGKey(cfg.train.seed))
    model = init_model(cfg, tokenizer.vocab_size, model_key, mesh)
    schedule = init_scheduler(cfg)
    optimizer = init_optimizer(cfg, schedule, model)
    return Pipeline(
        mesh,
        tokenizer,
        data,
        schedule,
        optimizer,
        *init_state_and_steps(cfg, model, schedule, optimizer, train_key, mesh),
    )
