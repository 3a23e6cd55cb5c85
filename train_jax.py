"""Train a GPT-2-style language model with JAX and Equinox: the recipe, top to bottom.

    python train_jax.py                                    # gpt2-mini on the Python standard library (the default)
    python train_jax.py model=gpt2 optimizer=adamw optimizer/lr_config=cosine optimizer.lr_config.lr=6e-4
    python train_jax.py checkpoint.load=True checkpoint.load_path=runs/<run>     # resume exactly where it stopped
    python train_jax.py mode=eval checkpoint.load=True checkpoint.load_path=runs/<run> checkpoint.load_file=best
    python train_jax.py --cfg                              # print the composed config and exit
    python train_jax.py -m optimizer=adamw,lion optimizer.lr_config.lr=1e-3,3e-3   # a sweep: runs/sweeps/<name>-<time>/
    python train_jax.py --help                             # config groups, launchers, sweepers, every key

A Hydra application: config lives in conf/, its typed schema and checks in training/config/, the command line's
errors, exit codes and sweep jobs in training/cli/app.py. Expected failures print one line and exit non-zero (2 for a
bad config); tracebacks are for bugs.
"""

from __future__ import annotations

import gc
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable

import hydra
import jax
import optax
from omegaconf import DictConfig

from data import Data, make_data
from data.prefetch import Prefetcher
from data.corpus import load_corpus
from data.notes_tokenizer import notes_tokenizer
from data.tokenizers import Tokenizer, build_tokenizer, tokenizer_from_json
from models import MODEL_BUILDERS
from optimizers import build_optimizer, build_schedule, geometry_groups, lr_multipliers
from training.cli import app as cli
from training import config as config_lib
from training.config import Config
from training.loop.session import TrainingRun
from training.loop.compilation import CompileClock, init_compilation_cache, init_xla_flags
from core.errors import DataError
from training.evaluation.splits import evaluate
from training.reporting.logs import eval_table
from training.loop.steps import run_loop
from training.distributed.peers import abandon, lost_peer, watch_peers
from training.checkpoints.resume import RunPlan, Source, plan_run, restore_state, shared_timestamp
from training.distributed.sharding import init_distributed, init_mesh, put_batch
from training.step.state import TrainState, eval_model, place_state
from training.step.stats import StatsKnobs
from training.step.train_step import compute_dtype, make_eval_step, make_train_step


def init_tokenizer(cfg: Config, corpus: dict, source: Source | None) -> Tokenizer:
    """A run that starts from a checkpoint keeps the checkpoint's tokenizer: its ids are what the weights learned."""
    d = cfg.dataset
    if source is not None:
        tokenizer = tokenizer_from_json(source.meta["tokenizer"])
        if tokenizer.kind != d.tokenizer:
            raise DataError(f"dataset.tokenizer: {d.tokenizer} does not match the checkpoint's "
                            f"{tokenizer.kind}; set dataset.tokenizer={tokenizer.kind}")
        if tokenizer.kind == "notes" and tokenizer.to_json() != notes_tokenizer(d).to_json():
            raise DataError(f"dataset.notes_tokenizer: {notes_tokenizer(d).to_json()} does not match the "
                            f"checkpoint's {tokenizer.to_json()}; use the checkpoint's settings")
        return tokenizer
    if d.tokenizer == "notes":
        return notes_tokenizer(d)
    return build_tokenizer(d.tokenizer, bpe_vocab_size=d.bpe_vocab_size, train_texts=corpus.train_texts,
                           corpus_fingerprint=corpus.fingerprint, cache_dir=d.cache_dir,
                           process_index=jax.process_index(), wait_s=d.build_timeout_s)


def load_data(cfg: Config, corpus: dict, tokenizer: Tokenizer) -> Data:
    return make_data(cfg, corpus, tokenizer, config_lib.context_size(cfg), jax.process_index(), jax.process_count())


def init_model(cfg: Config, vocab_size: int, key: jax.Array):
    return MODEL_BUILDERS[cfg.model.arch](cfg, vocab_size, key)


def init_scheduler(cfg: Config) -> optax.Schedule:
    return build_schedule(cfg.optimizer.lr_config, config_lib.schedule_steps(cfg))


def init_optimizer(cfg: Config, schedule: optax.Schedule, model) -> optax.GradientTransformation:
    return build_optimizer(cfg.optimizer, schedule, model, cfg.train.grad_accum_steps)


@dataclass
class Pipeline:
    """What the init_* functions make: everything the loop needs."""

    mesh: Any
    tokenizer: Tokenizer
    data: Data
    schedule: optax.Schedule
    optimizer: optax.GradientTransformation
    state: TrainState
    shardings: Any
    train_step: Callable
    eval_step: Callable


def build(cfg: Config, source: Source | None = None) -> Pipeline:
    """The init_* functions in order, on a mesh, with a fresh train state and the compiled-on-first-call steps."""
    mesh = init_mesh(cfg.system.num_devices, cfg.system.mesh_model)
    corpus = load_corpus(cfg.dataset, config_lib.mixture_sources(cfg.dataset))
    tokenizer = init_tokenizer(cfg, corpus, source)
    data = load_data(cfg, corpus, tokenizer)
    model_key, train_key = jax.random.split(jax.random.PRNGKey(cfg.train.seed))
    model = init_model(cfg, tokenizer.vocab_size, model_key)
    schedule = init_scheduler(cfg)
    optimizer = init_optimizer(cfg, schedule, model)
    return Pipeline(mesh, tokenizer, data, schedule, optimizer, *init_state_and_steps(cfg, model, optimizer,
                                                                                       train_key, mesh))


def init_state_and_steps(cfg: Config, model, optimizer: optax.GradientTransformation, key: jax.Array, mesh: Any
                         ) -> tuple[TrainState, Any, Callable, Callable]:
    """The train state on the mesh, its shardings, and the train and eval steps for the run's precision."""
    dtype = compute_dtype(cfg.system.dtype)
    knobs = StatsKnobs.from_cfg(cfg.logging, geometry_groups(cfg.optimizer, model))
    fp8_history = cfg.system.fp8_amax_history if cfg.system.dtype == "fp8" else 0
    state, shardings = place_state(model, optimizer, key, mesh, cfg.system.sharding, dtype, knobs, fp8_history)
    train_step = make_train_step(optimizer, shardings, dtype, cfg.train.skip_nonfinite, knobs=knobs,
                                 z_loss=cfg.train.z_loss, lr_multipliers=lr_multipliers(cfg.optimizer))
    return state, shardings, train_step, make_eval_step(dtype)


def main(cfg: Config, overrides: list[str], started: float) -> float | None:
    """One run of a finished config (typed, every value checked but those that need the devices): train (or,
    mode=eval, evaluate); returns the final `val` loss."""
    init_xla_flags(cfg.system.xla_flags)  # before XLA starts
    init_distributed(cfg.system)  # before anything touches a device
    watch_peers(cfg.system)  # a process that dies is named, and the others end
    init_compilation_cache(cfg.system.compilation_cache_dir)
    compile_clock = CompileClock()
    config_lib.check_devices(cfg, jax.local_device_count())
    plan = plan_run(cfg, overrides, shared_timestamp(started))
    cfg = plan.cfg  # a resumed run's saved config, checked, when it wins
    p = build(cfg, plan.resume or plan.init_from)
    state = restore_state(p.state, plan)
    if config_lib.evaluating(cfg):
        return evaluate_checkpoint(plan, p, state)
    return train(cfg, plan, p, state, started, compile_clock)


def evaluate_checkpoint(plan: RunPlan, p: Pipeline, state: TrainState) -> float:
    """mode=eval: every validation split and the test split, as a table and as JSON in the run directory."""
    splits = {**p.data.evals, **({"test": p.data.test} if p.data.test else {})}
    results = evaluate(p.eval_step, eval_model(state), splits, p.mesh, p.data.token_bytes)
    if jax.process_index() == 0:
        step, source = int(state.step), plan.resume.reader.directory
        out = plan.run_dir / f"eval-step{step}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"step": step, "checkpoint": str(source), "results": results}, indent=2))
        print(f"evaluated step {step} of {source}\n{eval_table(results)}\nwritten to {out}")
    return results[p.data.main_split]["loss"]


def train(cfg: Config, plan: RunPlan, p: Pipeline, state: TrainState, started: float,
          compile_clock: CompileClock) -> float | None:
    """The loop: step; at their intervals log, evaluate, checkpoint and agree to stop (training/loop/session.py). Ends
    at train.max_steps (or after checkpoint.num_steps), at the time limit or on SIGTERM/SIGINT, with an evaluation and
    a checkpoint as due; returns the last `val` loss (None when no evaluation ran)."""
    run = TrainingRun(cfg, plan, p, state, started, compile_clock)
    loop = run.loop_state(state)
    batches = Prefetcher(lambda s: put_batch(p.data.train.batch(s), p.mesh), loop.step, run.end)
    try:
        run.start(loop)
        run_loop(loop, p.train_step, batches.get, run.actions(loop.step), run.end, run.tokens_per_step,
                 after_step=run.log.advance, guard=cfg.system.transfer_guard)
        run.finish(loop)
        return loop.val_loss
    except Exception as e:  # before the clean-up below, which would wait for a lost process
        if (lost := lost_peer(e)) is not None:
            abandon(lost)
        raise
    finally:
        batches.close()
        run.close()


@hydra.main(config_path=str(config_lib.CONF_DIR), config_name="config", version_base=None)
def task(composed: DictConfig) -> float | None:
    """One Hydra job, a run or one job of a sweep: returns the run's final `val` loss, which sweepers minimise."""
    return cli.job(composed, main)


def run(argv: list[str]) -> int:
    """The command line (Hydra's: overrides, -m, --help, --cfg, -sc), as an exit code."""
    return cli.run(task, argv)


if __name__ == "__main__":
    code = run(sys.argv[1:])
    # Everything is written and closed: spare the interpreter's exit its last sweep over every object (0.5-0.7 s).
    gc.freeze()
    sys.exit(code)
