"""What a training run does around its steps: the loop's actions (log, evaluate, checkpoint, agree to stop) and the
run's start and end. training/loop/steps.py says when actions fire; this module says what each one does.

`TrainingSession` is a context manager: it holds the save path's lock, the checkpointer, the logger, the signal
handlers and the batch prefetcher, and gives them all back on the way out, whatever ends the run. A lost process
(training/distributed/peers.py) ends this one first, since the clean-up would wait for it.

  first step      wait for it once, and say how long compilation took
  log             every train.log_interval: fetch the interval's metrics (the one transfer per interval), stop on a
                  non-finite loss, write a line and the metrics
  evaluate        every train.eval_interval and at the end: every validation split, then a checkpoint
  agree to stop   signals and the time limit: every step in a single process (a host-only check), every log
                  interval across processes (a collective, so that all stop at the same step)
  save            at checkpoint.save_steps, unless the run stops at that step (its end evaluates, then saves)
  sharpness       every logging.hessian_every steps (when > 0): the largest and smallest Hessian eigenvalues of the eval
                  loss on a fixed validation batch (training/analysis/curvature.py), compiled at its first measurement;
                  nothing when off
  profile         around system.profile_steps: start and stop JAX's profiler trace (training/loop/profile.py)
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Iterator
from types import TracebackType

import jax
import numpy as np
from jax.experimental import multihost_utils

from core.errors import PipelineError, warn
from data.prefetch import Prefetcher
from models.fp8 import TENSORS
from models.gpt import GPT
from training import config as config_lib
from training.analysis.curvature import SEED, fixed_batch, sharpness_fn
from training.checkpoints.checkpointer import Checkpointer
from training.checkpoints.lock import lock_save_path
from training.checkpoints.metadata import checkpoint_meta
from training.checkpoints.resume import RunPlan, Source, carried_over, set_aside_logs
from training.config import Config, layout
from training.config.stages import model_after, plan_stages
from training.distributed.peers import abandon, lost_peer
from training.distributed.sharding import max_over_processes, put_batch
from training.loop.clock import RunClock, TrainingTime
from training.loop.compilation import CompileClock
from training.loop.profile import StepProfiler
from training.loop.signals import StopRequest
from training.loop.steps import Action, LoopState
from training.pipeline.build import Pipeline
from training.reporting.console import describe_run, eval_table
from training.reporting.flops import MFU_CONVENTION, MFU_FORMULA, flops_per_token, mfu, peak_flops
from training.reporting.logs import RunLogger
from training.reporting.summary import finish_run, wall_time_at, write_summary
from training.step.state import TrainState, eval_model
from training.step.stats import statistics_of


class TrainingSession:
    """The run's logger, checkpointer, clock, signal handler and prefetcher, and the actions that use them."""

    def __init__(
        self,
        cfg: Config,
        plan: RunPlan,
        pipeline: Pipeline,
        state: TrainState,
        started: float,
        compile_clock: CompileClock,
    ):
        self.cfg, self.plan, self.p, self.started, self.compile_clock = cfg, plan, pipeline, started, compile_clock
        self.is_main = jax.process_index() == 0
        self.resumed = plan.resume.meta if plan.resume else None
        self.lock = lock_save_path(plan.save_path) if cfg.checkpoint.save else None  # before anything is written
        if self.is_main:
            plan.run_dir.mkdir(parents=True, exist_ok=True)
            if plan.restarts_trained_run:
                set_aside_logs(plan.run_dir)
            (plan.run_dir / layout.CONFIG).write_text(config_lib.to_yaml(cfg))
        self.checkpointer = None
        if cfg.checkpoint.save:
            self.checkpointer = Checkpointer(
                plan.save_path, cfg.checkpoint.max_to_keep, config_lib.listed_save_steps(cfg)
            )
            if self.is_main:
                (plan.save_path / layout.CONFIG).write_text(config_lib.to_yaml(cfg))
            if plan.resume is not None and plan.resume.reader.directory == plan.save_path:
                self.set_aside_later_steps(plan.resume)
        t = cfg.train
        self.end = segment_end(cfg, int(state.step))
        wandb_id = None if plan.branch_of else carried_over(self.resumed, "wandb_id", None)  # a branch: its own
        self.log = RunLogger(cfg, plan.run_dir, self.end, int(state.step), self.is_main, wandb_id)
        self.clock = RunClock(started, t.max_training_hours, self.tokens_before, self.end)
        self.signals = StopRequest()
        self.flops = flops_per_token(state.model, config_lib.context_size(cfg))
        self.peak = peak_flops(jax.devices()[0].device_kind, cfg.system.dtype, cfg.system.peak_flops)
        self.trained_before = carried_over(self.resumed, "time_trained_s", 0.0)
        self.wall_before = carried_over(self.resumed, "wall_time_s", 0.0)  # when its checkpoint was saved
        if (
            plan.resume is not None
            and plan.resume.reader is not None
            and plan.resume.reader.directory == plan.save_path
        ):
            # this run's own segment that ended there: its end too (a rerun that trained nothing lowered the figure)
            self.wall_before = max(self.wall_before, wall_time_at(plan.run_dir, plan.resume.step) or 0.0)
        self.first_step = int(state.step)
        self.training = TrainingTime()  # this invocation's: from the loop's start to its end, less what is not training
        self.profiler = StepProfiler(plan.run_dir, list(cfg.system.profile_steps), self.is_main)
        self.sharpness = None  # the compiled measurement and its batch, made at the first one (logging.hessian_every)
        self.prefetcher: Prefetcher | None = None
        self.loop_started = time.time()

    def set_aside_later_steps(self, resume: Source) -> None:
        """A run resumed in its own save path from an older step than its newest (a damaged newest one, or
        `checkpoint.load_file=<step>` / `best`) trains those steps again: their checkpoints are renamed out of the way,
        kept, so that none of them passes for this run's (a later `checkpoint.load=auto` would take it) and this run
        saves its own at those steps."""
        damaged = {step for step, _ in resume.passed_over}
        later = [s for s in self.checkpointer.steps() if s > resume.step]
        if self.is_main:
            for step in later:
                aside = self.checkpointer.set_aside(step, "damaged" if step in damaged else "superseded")
                if step not in damaged:
                    warn(f"checkpoint: step {step} is past the resumed step {resume.step}; kept as {aside}")
        if later and jax.process_count() > 1:  # every process's manager lists the steps as process 0 left them
            multihost_utils.sync_global_devices("checkpoints set aside")
            self.checkpointer.reload()

    def tokens_before(self, step: int) -> int:
        """Training tokens of the run's first `step` steps (the batch may grow with train.stages)."""
        return self.p.data.train.samples_before(step) * config_lib.context_size(self.cfg)

    def tokens_of(self, step: int) -> int:
        """Training tokens of the step after `step` completed ones."""
        return self.tokens_before(step + 1) - self.tokens_before(step)

    def eval_model(self, loop: LoopState) -> GPT:
        """The model to evaluate after `loop.step` steps: as its last step's stage read it (train.stages' window)."""
        return model_after(eval_model(loop.state), self.cfg, loop.step)

    def __enter__(self) -> TrainingSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if error is not None and (lost := lost_peer(error)) is not None:
            abandon(lost)  # before the clean-up below, which would wait for the lost process
        if isinstance(error, PipelineError) and self.is_main:  # a non-finite loss, a failed save, ...: what it
            # logged is flushed, and its summary says it stopped there (compare_runs and sweeps read it as unfinished)
            self.log.close()
            write_summary(self.plan.run_dir, {"stopped": f"error: {error}"})
        if isinstance(error, KeyboardInterrupt):
            # a second Ctrl-C (training/loop/signals.py) is for when the checkpoint's writing is what hangs: its
            # writer's threads would hold the interpreter's exit too, so the process leaves at once (its lock and a
            # half-written step go with it; the last complete checkpoint stays)
            print(
                "error: interrupted again: leaving without waiting for the checkpoint being written (the last "
                "complete one stays)",
                file=sys.stderr,
                flush=True,
            )
            sys.stdout.flush()
            os._exit(130)
        self.close()

    def loop_state(self, state: TrainState) -> LoopState:
        """Where the loop starts: step 0, or where the checkpoint left off (whose val loss is the run's last until it
        evaluates again: a run resumed at its end reports it)."""
        best = carried_over(self.resumed, "best_val_loss", None)
        return LoopState(
            state,
            int(state.step),
            carried_over(self.resumed, "tokens_seen", 0),
            val_loss=carried_over(self.resumed, "val_loss", None),
            best_val=math.inf if best is None else best,
        )

    def batches(self, first_step: int) -> Prefetcher:
        """The training batches from `first_step` on, each placed on the mesh ahead of its step."""
        self.prefetcher = Prefetcher(lambda s: put_batch(self.p.data.train.batch(s), self.p.mesh), first_step, self.end)
        return self.prefetcher

    def actions(self, first_step: int) -> list[Action]:
        t, single = self.cfg.train, jax.process_count() == 1
        save_steps = self.cfg.checkpoint.save_steps
        later = [s.first_step for s in plan_stages(self.cfg)[1:]]
        return [
            Action(self.first_step_done, steps=frozenset({first_step + 1})),
            Action(self.stage_ending, steps=frozenset(s for s in later if s > first_step)),
            Action(self.stage_started, steps=frozenset(s + 1 for s in later if s >= first_step)),
            Action(self.log_interval, every=t.log_interval, at_end=True),
            Action(self.evaluate_and_save, every=t.eval_interval, at_end=True),
            Action(self.agree_to_stop, every=1 if single else t.log_interval, syncs=not single),
            Action(
                self.scheduled_save,
                every=save_steps if isinstance(save_steps, int) else None,
                steps=frozenset(config_lib.listed_save_steps(self.cfg)),
            ),
            *(
                [Action(self.measure_sharpness, every=self.cfg.logging.hessian_every)]
                if self.cfg.logging.hessian_every
                else []
            ),
            Action(self.profile, steps=self.profiler.boundaries(first_step)),
        ]

    # -- the actions -----------------------------------------------------------------------------------------------
    def first_step_done(self, loop: LoopState) -> None:
        jax.block_until_ready(loop.pending[-1])
        self.log.info(
            f"compiled in {self.compile_clock.stop():.1f} s; first step done "
            f"{time.time() - self.loop_started:.1f} s after the loop started"
        )
        self.clock.mark(loop.step)

    def stage_ending(self, loop: LoopState) -> None:
        """The last step before a later stage: timed up to here, the stage's first step compiling (`stage_started`)."""
        jax.block_until_ready(loop.pending[-1])
        self.clock.pause(loop.step)

    def stage_started(self, loop: LoopState) -> None:
        """A later stage's first step, which compiled its batch's and window's programs: throughput is measured
        from here, as from the run's first step (it was counted in the interval's step time: 453 tokens/s where
        the steps ran at 25,700; and an interval logged at this step had no rate: the steps before it are kept)."""
        jax.block_until_ready(loop.pending[-1])
        self.clock.mark(loop.step)

    def log_interval(self, loop: LoopState) -> None:
        """Fetch the interval's metrics, stop on a non-finite loss, log the token-weighted mean loss."""
        fetched, loop.pending = jax.device_get(loop.pending), []
        losses = [float(m["loss"]) for m in fetched]
        if "applied" not in fetched[0]:  # no guard (float16 and train.skip_nonfinite skip such steps instead)
            for i, loss in enumerate(losses):
                if not math.isfinite(loss):
                    raise PipelineError(
                        f"step {loop.step - len(losses) + i + 1}: the training loss is {loss}; stopping (no checkpoint "
                        "of this state is written). Lower the lr, or set train.skip_nonfinite=true to skip such steps"
                    )
        loop.train_loss = _token_weighted(fetched, "loss")
        tokens_per_s, ms_per_step = self.clock.interval(loop.step)
        last = fetched[-1]
        self.log.train(
            loop.step,
            {
                "loss": loop.train_loss,
                "lr": float(last["lr"]),
                "grad_norm": float(last["grad_norm"]),
                **({"z_loss": _token_weighted(fetched, "z_loss")} if "z_loss" in last else {}),
                "tokens_per_s": tokens_per_s,
                "ms_per_step": ms_per_step,
                "tokens_seen": loop.tokens_seen,
                **{f"tokens_seen/{name}": n for name, n in self.p.data.tokens_by_source(loop.step).items()},
                "mfu": mfu(tokens_per_s, self.flops, self.peak, self.p.mesh.devices.size),
                "skipped_steps": int(last["skipped_steps"]),
                "loss_scale": float(last["loss_scale"]),
                **fp8_interval(fetched),
                "elapsed_s": self.wall_seconds(loop.step),  # the run's: earlier segments' too
                "remaining_s": self.clock.remaining(loop.step),
                **statistics_of(last),
            },
        )

    @contextlib.contextmanager
    def not_training(self, loop: LoopState) -> Iterator[None]:
        """Evaluating, saving and measuring are no training time (`time_trained_s`) nor throughput; the steps
        dispatched before are both (the interval's steps up to here stay timed: a mark alone dropped them)."""
        jax.block_until_ready(loop.state)
        self.clock.pause(loop.step)
        with self.training.paused():
            yield
        self.clock.mark(loop.step)

    def evaluate_and_save(self, loop: LoopState) -> None:
        with self.not_training(loop):
            loop.results = self.p.evaluate(self.eval_model(loop))
            loop.val_loss = loop.results[self.p.data.main_split]["loss"]
            loop.best_val = min(loop.best_val, loop.val_loss)
            self.log.eval(loop.step, loop.results)
            self.save(loop, loop.val_loss)

    def wall_seconds(self, step: int) -> float:
        """The run's wall time at `step`, set-up included: the segments' before the checkpoint it resumed from (what
        a killed process spent after its last checkpoint is not known), and this invocation's unless it trained no
        step (the same command again on a finished run)."""
        return self.wall_before + (time.time() - self.started if step > self.first_step else 0.0)

    def save(self, loop: LoopState, val_loss: float | None = None) -> None:
        if self.checkpointer is not None:
            with self.not_training(loop):
                meta = checkpoint_meta(
                    self.cfg,
                    self.plan.run_dir,
                    self.p.tokenizer,
                    loop.step,
                    loop.tokens_seen,
                    loop.train_loss,
                    val_loss,
                    loop.best_val,
                    self.log.wandb_id,
                    self.trained_before + self.training.seconds(),
                    self.wall_seconds(loop.step),
                )
                if not self.checkpointer.save(loop.state, meta, val_loss):
                    self.log.info(f"step {loop.step}: parameters are not finite; no checkpoint written")

    def scheduled_save(self, loop: LoopState) -> None:
        """checkpoint.save_steps' save, unless the run stops at this step: `finish` saves then, after the evaluation
        that a time limit gets (a checkpoint saved first would keep no val loss)."""
        if loop.stop is None:
            self.save(loop)

    def measure_sharpness(self, loop: LoopState) -> None:
        """The extreme Hessian eigenvalues of the eval loss (training/analysis/curvature.py, Lanczos) at the training
        parameters (not schedule-free's averaged weights), on the fixed validation batch: `sharpness` the largest,
        `hessian_min` the smallest."""
        if self.sharpness is None:
            self.sharpness = (
                sharpness_fn(self.cfg.logging.hessian_iters),
                put_batch(fixed_batch(self.p.data), self.p.mesh),
            )
        measure, batch = self.sharpness
        with self.not_training(loop):
            extremes = measure(loop.state.model, batch, jax.random.PRNGKey(SEED))
            top, bottom, products = (x.item() for x in jax.device_get(extremes))
        self.log.scalars(
            loop.step,
            "curvature",
            {"sharpness": top, "hessian_min": bottom, "sharpness_iterations": products},
            f"curv {loop.step:>6} | sharpness {top:.4g} (largest Hessian eigenvalue), smallest "
            f"{bottom:.4g} (Lanczos, {products} Hessian-vector products)",
        )

    def profile(self, loop: LoopState) -> None:
        """Start or stop system.profile_steps' trace: not training throughput (stopping writes the trace's files,
        which made the interval after it log 717 ms/step against 15)."""
        with self.not_training(loop):
            self.profiler.after_step(loop.step, loop.state)

    def agree_to_stop(self, loop: LoopState) -> None:
        if loop.step >= self.end:
            return  # every step trained, evaluated and saved: a time limit or signal now stops nothing
        loop.stop = agreed_stop(self.signals.signal_name or ("time limit" if self.clock.out_of_time() else None))

    # -- start and end ---------------------------------------------------------------------------------------------
    def start(self, loop: LoopState) -> None:
        for line in describe_run(
            self.cfg, self.plan, self.p.mesh, self.p.data, loop.state.model, self.p.tokenizer, self.p.schedule
        ):
            self.log.info(line)
        self.log.info(f"MFU counts {MFU_FORMULA[MFU_CONVENTION]} FLOPs per token: {self.flops / 1e6:.1f} MFLOP")
        if self.end < self.cfg.train.max_steps:
            self.log.info(
                f"segment    checkpoint.num_steps={self.cfg.checkpoint.num_steps}: steps {loop.step + 1} to "
                f"{self.end} of train.max_steps={self.cfg.train.max_steps}"
            )
        self.profiler.at_start(loop.step, loop.state)
        if self.cfg.train.eval_at_start and loop.step == 0:  # the curves' starting point, e.g. init_from's weights
            self.log.eval(0, self.p.evaluate(self.eval_model(loop)))
        if loop.step < self.end:  # a run resumed at its end trains nothing: no training time
            self.training.start()

    def finish(self, loop: LoopState) -> None:
        """A stopped run logs what it trained, evaluates (a time limit, which is a chosen budget) and checkpoints."""
        jax.block_until_ready(loop.state)  # the steps dispatched last are training time
        self.training.stop()
        self.profiler.stop(loop.state)
        if loop.stop is not None:
            if loop.pending:
                self.log_interval(loop)
            if loop.stop == "time limit" and loop.step % self.cfg.train.eval_interval:
                self.evaluate_and_save(loop)
            self.save(loop)  # a no-op when this step is already saved
            where = f"; checkpoint saved to {self.plan.save_path}" if self.checkpointer else ""
            self.log.info(f"stopped at step {loop.step} ({loop.stop}){where}")
        if loop.results is not None and loop.stop in (None, "time limit"):
            self.log.info(f"final evaluation at step {loop.step}:\n{eval_table(loop.results)}")
        segment_done = loop.stop is None and loop.step < self.cfg.train.max_steps
        if segment_done:
            # a run directory of the command's own, or the one made for it (runs/<name>-<time>: named, or the same
            # command would start another)
            named = self.cfg.logging.run_dir or self.cfg.checkpoint.save_path
            add = [] if named else [f"logging.run_dir={self.plan.run_dir}"]
            add += [] if self.cfg.checkpoint.load == "auto" else ["checkpoint.load=auto"]
            again = f" with {' '.join(add)}" if add else ""
            where = (
                f"; checkpoint saved to {self.plan.save_path}, the same command{again} continues"
                if self.checkpointer
                else ""
            )
            self.log.info(
                f"trained checkpoint.num_steps={self.cfg.checkpoint.num_steps} steps, to step {loop.step} of "
                f"train.max_steps={self.cfg.train.max_steps}{where}"
            )
        if by_source := self.p.data.tokens_by_source(loop.step):
            self.log.info(
                "training tokens per source: "
                + ", ".join(
                    f"{name} {n:,} ({n / max(sum(by_source.values()), 1):.1%})" for name, n in by_source.items()
                )
            )
        final = None if loop.val_loss is None else {"val_loss": loop.val_loss}
        self.log.close(hparams=config_lib.flat_hparams(self.cfg), final=final)
        if self.is_main:
            from models.gpt import count_params

            finish_run(
                self.plan.run_dir,
                self.checkpointer,
                "checkpoint.num_steps" if segment_done else loop.stop,
                self.wall_seconds(loop.step),
                self.trained_before + self.training.seconds(),
                count_params(loop.state.model),
                MFU_FORMULA[MFU_CONVENTION],
                plot=self.cfg.logging.plot,
            )

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.signals.uninstall()
        if self.checkpointer is not None:
            self.checkpointer.close()
        if self.lock is not None:
            self.lock.release()


def segment_end(cfg: Config, first_step: int) -> int:
    """The step this invocation trains to: train.max_steps, or, with checkpoint.num_steps (trainit's steps of one
    checkpointed run), that many steps after the one it starts from, if sooner. The schedule still spans max_steps."""
    num_steps = cfg.checkpoint.num_steps
    return cfg.train.max_steps if num_steps is None else min(first_step + num_steps, cfg.train.max_steps)


def _token_weighted(fetched: list[dict], name: str) -> float:
    """The steps' mean of `name` weighted by their target tokens: every target token of the interval counts once.
    Skipped steps (a non-finite gradient, under float16 or train.skip_nonfinite) and non-finite values are left
    out."""
    pairs = [
        (float(m[name]), float(m["target_tokens"]))
        for m in fetched
        if math.isfinite(float(m[name])) and bool(m.get("applied", True))
    ]
    tokens = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / tokens if tokens else math.nan


def fp8_interval(fetched: list[dict]) -> dict[str, float]:
    """system.dtype=fp8: the FP8 tensors clipped in the interval's steps (a tensor once per step it outgrew its
    scale's range) and the largest amax over range (models/fp8.py `amax_over_range`), in all and per kind of tensor
    (`fp8_clipped/input`, `/weight`, `/gradient`); else nothing."""
    if "fp8_clipped" not in fetched[-1]:
        return {}
    clipped = np.sum([np.asarray(m["fp8_clipped"]) for m in fetched], axis=0)
    largest = np.max([np.asarray(m["fp8_amax_over_range"]) for m in fetched], axis=0)
    return {
        "fp8_clipped": int(clipped.sum()),
        **{f"fp8_clipped/{name}": int(n) for name, n in zip(TENSORS, clipped, strict=True)},
        "fp8_amax_over_range": float(largest.max()),
        **{f"fp8_amax_over_range/{name}": float(r) for name, r in zip(TENSORS, largest, strict=True)},
    }


def agreed_stop(reason: str | None) -> str | None:
    """Every process stops at the same step for the same kind of reason (a time limit evaluates first, a signal
    does not), or the ones still running would wait forever in their next collective."""
    code = 0 if reason is None else 1 if reason == "time limit" else 2
    agreed = max_over_processes(code)
    return reason if agreed == code else {1: "time limit", 2: "a signal to another process"}[agreed]
