"""Train a GPT-2-style language model with JAX and Equinox: the recipe, top to bottom.

    python train_jax.py                                    # gpt2-mini on the Python standard library (the default)
    python train_jax.py model=gpt2 optimizer=adamw optimizer/lr_config=cosine optimizer.lr_config.lr=6e-4
    python train_jax.py checkpoint.load=True checkpoint.load_path=runs/<run>     # resume exactly where it stopped
    python train_jax.py mode=eval checkpoint.load=True checkpoint.load_path=runs/<run> checkpoint.load_file=best
    python train_jax.py --cfg                              # print the composed config and exit
    python train_jax.py -m optimizer=adamw,lion optimizer.lr_config.lr=1e-3,3e-3   # a sweep: runs/sweeps/<name>-<time>/
    python train_jax.py --help                             # config groups, launchers, sweepers, every key

A Hydra application: config lives in conf/, its typed schema and checks in training/config/, the command line's
errors, exit codes and sweep jobs in training/cli/. The init_* functions that build the pipeline (tokenizer, data,
model, schedule, optimizer, train state and steps) are in training/pipeline/build.py; the loop's actions in
training/loop/session.py; docs/ARCHITECTURE.md maps the rest. Expected failures print one line and exit non-zero
(2 for a bad config); tracebacks are for bugs.
"""

from __future__ import annotations

import gc
import sys

import hydra
import jax
from omegaconf import DictConfig

from training import config as config_lib
from training.checkpoints.resume import RunPlan, check_data_position, plan_run, restore_state, shared_timestamp
from training.cli import app as cli
from training.config import Config
from training.config.stages import model_after
from training.distributed.peers import watch_peers
from training.distributed.sharding import init_distributed
from training.evaluation.results import eval_settings, write_eval_result
from training.loop.compilation import CompileClock, init_compilation_cache, init_xla_flags
from training.loop.host_memory import init_host_memory
from training.loop.session import TrainingSession
from training.loop.steps import run_loop
from training.pipeline.build import Pipeline, build
from training.reporting.console import eval_table, ignored_note
from training.step.state import TrainState, eval_model


def main(cfg: Config, overrides: list[str], started: float) -> float | None:
    """One run of a finished config (typed, every value checked but those that need the devices): train (or,
    mode=eval, evaluate); returns the final `val` loss."""
    init_host_memory(cfg.system.reuse_host_memory)  # before XLA starts its threads
    init_xla_flags(cfg.system)  # before XLA starts
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
    model = model_after(eval_model(state), plan.cfg, int(state.step))  # as its step's stage read it (train.stages)
    results = p.evaluate(model, {**p.data.evals, **({"test": p.data.test} if p.data.test else {})})
    if jax.process_index() == 0:
        if note := ignored_note(plan):
            print(note)
        step, source = int(state.step), plan.resume.reader.directory
        record = {"step": step, "checkpoint": str(source), "results": results}
        out = write_eval_result(plan.run_dir, record, eval_settings(plan.cfg, p.tokenizer.kind, results))
        print(f"evaluated step {step} of {source}\n{eval_table(results)}\nwritten to {out}")
    return results[p.data.main_split]["loss"]


def train(
    cfg: Config, plan: RunPlan, p: Pipeline, state: TrainState, started: float, compile_clock: CompileClock
) -> float | None:
    """The loop: step; at their intervals log, evaluate, checkpoint and agree to stop (training/loop/session.py). Ends
    at train.max_steps (or after checkpoint.num_steps), at the time limit or on SIGTERM/SIGINT, with an evaluation and
    a checkpoint as due; returns the last `val` loss (None when no evaluation ran)."""
    check_data_position(plan, p.data.train.samples_before, config_lib.context_size(cfg))
    with TrainingSession(cfg, plan, p, state, started, compile_clock) as session:
        loop = session.loop_state(state)
        batches = session.batches(loop.step)
        session.start(loop)
        run_loop(
            loop,
            p.train_step,
            batches.get,
            session.actions(loop.step),
            session.end,
            session.tokens_of,
            after_step=session.log.advance,
            guard=cfg.system.transfer_guard,
        )
        session.finish(loop)
        return loop.val_loss


@hydra.main(config_path=str(config_lib.CONF_DIR), config_name="config", version_base=None)
def task(composed: DictConfig) -> float | None:
    """One Hydra job, a run or one job of a sweep: returns the run's final `val` loss, which sweepers minimise."""
    return cli.job(composed, main)


def command_line(argv: list[str]) -> int:
    """The command line (Hydra's: overrides, -m, --help, --cfg, -sc), as an exit code."""
    return cli.execute(task, argv)


if __name__ == "__main__":
    code = command_line(sys.argv[1:])
    # Everything is written and closed: spare the interpreter's exit its last sweep over every object (0.5-0.7 s).
    gc.freeze()
    sys.exit(code)
