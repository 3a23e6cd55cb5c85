"""Train a GPT-2-style language model with JAX and Equinox: the recipe, top to bottom.

    python train_jax.py                                    # gpt2-mini on the Python standard library (the default)
    python train_jax.py model=gpt2 optimizer=adamw optimizer/lr_config=cosine optimizer.lr_config.lr=6e-4
    python train_jax.py checkpoint.load=True checkpoint.load_path=runs/<run>     # resume exactly where it stopped
    python train_jax.py mode=eval checkpoint.load=True checkpoint.load_path=runs/<run> checkpoint.load_file=best
    python train_jax.py --cfg                              # print the composed config and exit

Config lives in conf/ (Hydra); its schema and checks are in training/config.py. Expected failures print one line
and exit non-zero (2 for a bad config); tracebacks are for bugs.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import optax

from data import Data, make_data
from data.prefetch import Prefetcher
from data.sources import load_corpus
from data.notes_tokenizer import notes_tokenizer
from data.tokenizers import Tokenizer, build_tokenizer, tokenizer_from_json
from models import MODEL_BUILDERS
from models.gpt import count_params
from optimizers import build_optimizer, build_schedule
from training import config as config_lib
from training.checkpoint import Checkpointer, checkpoint_meta
from training.clock import RunClock
from training.compilation import CompileClock, init_compilation_cache
from training.errors import DataError, PipelineError
from training.evaluate import evaluate
from training.flops import flops_per_token, peak_flops
from training.logs import RunLogger, describe_run, eval_table
from training.report import finish_run
from training.run import RunPlan, Source, carried_over, plan_run, restore_state, shared_timestamp
from training.sharding import init_distributed, init_mesh, max_over_processes, put_batch
from training.signals import StopRequest
from training.state import TrainState, place_state
from training.stats import StatsKnobs, statistics_of
from training.step import COMPUTE_DTYPES, make_eval_step, make_train_step


def init_tokenizer(cfg, corpus: dict, source: Source | None) -> Tokenizer:
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
    return build_tokenizer(d.tokenizer, bpe_vocab_size=d.bpe_vocab_size, train_texts=_texts(corpus["train"]),
                           corpus_fingerprint=corpus["train"]._fingerprint, cache_dir=d.cache_dir)


def _texts(ds):
    """What a BPE learns from: documents, or prompts and completions."""
    if "text" in ds.column_names:
        return ds["text"]
    return [t for row in zip(ds["prompt"], ds["completion"]) for t in row if t]


def load_data(cfg, corpus: dict, tokenizer: Tokenizer) -> Data:
    return make_data(cfg, corpus, tokenizer, config_lib.context_size(cfg), jax.process_index(), jax.process_count())


def init_model(cfg, vocab_size: int, key: jax.Array):
    return MODEL_BUILDERS[cfg.model.arch](cfg, vocab_size, key)


def init_scheduler(cfg) -> optax.Schedule:
    return build_schedule(cfg.optimizer.lr_config, config_lib.schedule_steps(cfg))


def init_optimizer(cfg, schedule: optax.Schedule, model) -> optax.GradientTransformation:
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


def build(cfg, source: Source | None = None) -> Pipeline:
    """The init_* functions in order, on a mesh, with a fresh train state and the compiled-on-first-call steps."""
    mesh = init_mesh(cfg.system.num_devices, cfg.system.mesh_model)
    corpus = load_corpus(cfg.dataset)
    tokenizer = init_tokenizer(cfg, corpus, source)
    data = load_data(cfg, corpus, tokenizer)
    model_key, train_key = jax.random.split(jax.random.PRNGKey(cfg.train.seed))
    model = init_model(cfg, tokenizer.vocab_size, model_key)
    schedule = init_scheduler(cfg)
    optimizer = init_optimizer(cfg, schedule, model)
    dtype, knobs = COMPUTE_DTYPES[cfg.system.dtype], StatsKnobs.from_cfg(cfg.logging)
    state, shardings = place_state(model, optimizer, train_key, mesh, cfg.system.sharding, dtype, knobs)
    return Pipeline(mesh, tokenizer, data, schedule, optimizer, state, shardings,
                    make_train_step(optimizer, shardings, dtype, cfg.train.skip_nonfinite, knobs=knobs),
                    make_eval_step(dtype))


def main(argv: list[str]) -> None:
    started = time.time()
    if "--cfg" in argv:
        print(config_lib.to_yaml(config_lib.load_config([a for a in argv if a != "--cfg"])))
        return
    cfg = config_lib.load_config(argv)
    init_distributed(cfg.system)  # before anything touches a device
    init_compilation_cache(cfg.system.compilation_cache_dir)
    compile_clock = CompileClock()
    config_lib.validate(cfg, jax.local_device_count())
    plan = plan_run(cfg, argv, shared_timestamp(started))
    cfg = plan.cfg
    config_lib.validate(cfg, jax.local_device_count())
    p = build(cfg, plan.resume or plan.init_from)
    state = restore_state(p.state, plan)
    if config_lib.evaluating(cfg):
        evaluate_checkpoint(plan, p, state)
    else:
        train(cfg, plan, p, state, started, compile_clock)


def evaluate_checkpoint(plan: RunPlan, p: Pipeline, state: TrainState) -> None:
    """mode=eval: every validation split and the test split, as a table and as JSON in the run directory."""
    splits = {**p.data.evals, **({"test": p.data.test} if p.data.test else {})}
    results = evaluate(p.eval_step, state.model, splits, p.mesh, p.data.token_bytes)
    if jax.process_index() == 0:
        step, source = int(state.step), plan.resume.reader.directory
        out = plan.run_dir / f"eval-step{step}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"step": step, "checkpoint": str(source), "results": results}, indent=2))
        print(f"evaluated step {step} of {source}\n{eval_table(results)}\nwritten to {out}")


def train(cfg, plan: RunPlan, p: Pipeline, state: TrainState, started: float, compile_clock: CompileClock) -> None:
    """The loop: step, log, evaluate, checkpoint. Stops at max_steps, at the time limit or on SIGTERM/SIGINT."""
    t, is_main = cfg.train, jax.process_index() == 0
    resumed = plan.resume.meta if plan.resume else None
    if is_main:
        plan.run_dir.mkdir(parents=True, exist_ok=True)
        (plan.run_dir / "config.yaml").write_text(config_lib.to_yaml(cfg))
    checkpointer = None
    if cfg.checkpoint.save:
        checkpointer = Checkpointer(plan.save_path, cfg.checkpoint.max_to_keep, config_lib.listed_save_steps(cfg))
        if is_main:
            (plan.save_path / "config.yaml").write_text(config_lib.to_yaml(cfg))
    log = RunLogger(cfg, plan.run_dir, t.max_steps, int(state.step), is_main, carried_over(resumed, "wandb_id", None))
    for line in describe_run(cfg, plan, p.mesh, p.data, state.model, p.tokenizer, p.schedule):
        log.info(line)

    tokens_per_step = p.data.train.global_batch * config_lib.context_size(cfg)
    peak = peak_flops(jax.devices()[0].device_kind, cfg.system.dtype, cfg.system.peak_flops)
    flop_rate = None if peak is None else flops_per_token(state.model, config_lib.context_size(cfg)) / (
        peak * p.mesh.devices.size)  # MFU per token/s
    tokens_seen = carried_over(resumed, "tokens_seen", 0)
    best_val = carried_over(resumed, "best_val_loss", None) or math.inf
    trained_before = carried_over(resumed, "time_trained_s", 0.0)
    clock = RunClock(started, t.max_training_hours, tokens_per_step, t.max_steps)
    stop = StopRequest()
    loop_started, pending, train_loss, val_loss, results = time.time(), [], math.nan, None, None

    def save(step: int, val: float | None) -> None:
        if checkpointer is None:
            return
        meta = checkpoint_meta(cfg, plan, p.tokenizer, step, tokens_seen, train_loss, val, best_val, log.wandb_id,
                               trained_before + time.time() - loop_started)
        if not checkpointer.save(state, meta, val):
            log.info(f"step {step}: parameters are not finite; no checkpoint written")

    def evaluate_and_save(step: int) -> None:
        nonlocal results, val_loss, best_val
        results = evaluate(p.eval_step, state.model, p.data.evals, p.mesh, p.data.token_bytes)
        val_loss = results[p.data.main_split]["loss"]
        best_val = min(best_val, val_loss)
        log.eval(step, results)
        save(step, val_loss)

    step, reason = int(state.step), None
    first = step
    if t.eval_at_start and step == 0:  # the starting point of the curves, e.g. what init_from's weights score
        log.eval(0, evaluate(p.eval_step, state.model, p.data.evals, p.mesh, p.data.token_bytes))
    batches = Prefetcher(lambda s: put_batch(p.data.train.batch(s), p.mesh), first, t.max_steps)
    try:
        while step < t.max_steps and reason is None:
            state, metrics = p.train_step(state, batches.get(step))
            pending.append(metrics)
            step += 1
            tokens_seen += tokens_per_step
            log.advance()
            if step == first + 1:
                jax.block_until_ready(metrics)
                log.info(f"compiled in {compile_clock.stop():.1f} s; first step done {time.time() - loop_started:.1f} s "
                         "after the loop started")
                clock.mark(step)
            if step % t.log_interval == 0 or step == t.max_steps:
                train_loss = log_train_interval(log, clock, p.schedule, pending, step, tokens_seen, t.skip_nonfinite,
                                                flop_rate)
                pending = []
            if step % t.eval_interval == 0 or step == t.max_steps:
                evaluate_and_save(step)
                clock.mark(step)  # evaluation time is not training throughput
            elif config_lib.is_save_step(cfg, step):
                save(step, None)
                clock.mark(step)
            reason = agreed_stop(stop.signal_name or ("time limit" if clock.out_of_time() else None))

        if reason == "time limit" and step % t.eval_interval:  # a chosen budget still ends with an evaluation
            evaluate_and_save(step)
        if reason is not None:
            save(step, None)  # a no-op when this step is already saved
            where = f"; checkpoint saved to {plan.save_path}" if checkpointer else ""
            log.info(f"stopped at step {step} ({reason}){where}")
        if results is not None and reason in (None, "time limit"):
            log.info(f"final evaluation at step {step}:\n{eval_table(results)}")
        log.close(hparams=config_lib.flat_hparams(cfg), final=None if val_loss is None else {"val_loss": val_loss})
        if is_main:
            finish_run(plan.run_dir, checkpointer, reason, time.time() - started, count_params(state.model))
    finally:
        batches.close()
        stop.uninstall()
        if checkpointer is not None:
            checkpointer.close()


def log_train_interval(log: RunLogger, clock: RunClock, schedule: optax.Schedule, pending: list, step: int,
                       tokens_seen: int, skip_nonfinite: bool, flop_rate: float | None) -> float:
    """Fetch the interval's metrics (the one host sync per interval), stop on a non-finite loss, log a line."""
    fetched = jax.device_get(pending)
    losses = [float(m["loss"]) for m in fetched]
    if not skip_nonfinite:
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):
                first = step - len(losses) + i + 1
                raise PipelineError(f"step {first}: the training loss is {loss}; stopping (no checkpoint of this "
                                    "state is written). Lower the lr, or set train.skip_nonfinite=true to skip such steps")
    tokens_per_s, ms_per_step = clock.interval(step)
    finite = [x for x in losses if math.isfinite(x)]
    loss = sum(finite) / len(finite) if finite else math.nan
    log.train(step, {
        "loss": loss, "lr": float(schedule(step - 1)), "grad_norm": float(fetched[-1]["grad_norm"]),
        "tokens_per_s": tokens_per_s, "ms_per_step": ms_per_step, "tokens_seen": tokens_seen,
        "mfu": None if flop_rate is None else tokens_per_s * flop_rate,
        "skipped_steps": int(fetched[-1]["skipped_steps"]), "loss_scale": float(fetched[-1]["loss_scale"]),
        "elapsed_s": clock.elapsed(), "remaining_s": clock.remaining(step),
        **statistics_of(fetched[-1]),
    })
    return loss


def agreed_stop(reason: str | None) -> str | None:
    """Every process stops at the same step for the same kind of reason (a time limit evaluates first, a signal
    does not), or the ones still running would wait forever in their next collective."""
    code = 0 if reason is None else 1 if reason == "time limit" else 2
    agreed = max_over_processes(code)
    return reason if agreed == code else {1: "time limit", 2: "a signal to another process"}[agreed]


def run(argv: list[str]) -> int:
    try:
        main(argv)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
