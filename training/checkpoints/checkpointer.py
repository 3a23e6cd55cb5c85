"""Checkpoints through Orbax: one directory per step holding the train state's arrays and a JSON metadata item.

    <save_path>/config.yaml          the run's config (what `checkpoint.overwrite_config=False` restores)
    <save_path>/<step>/model/        the parameters (the Equinox model's arrays)
    <save_path>/<step>/opt_state/    the optimizer state, incl. MultiSteps' accumulator and any loss scale
    <save_path>/<step>/progress/     step, PRNG key, loss scale, skipped-step count and (fp8) the amax histories
    <save_path>/<step>/meta/         JSON: step, tokens seen, losses, config, tokenizer, versions, ... (metadata.py)
    <save_path>/<step>/eval_model/   schedule-free only: the averaged weights x, what sampling and export read
    <save_path>/<step>/stats/        the training statistics' buffers (and the update geometry's running sums), only
                                     when the run's knobs made them (training/step/stats.py)

The three array items (and stats/ when present) together are the whole TrainState; they are separate so that a run can
take the weights alone (`init_from`, `checkpoint.overwrite_optimizer=True`) even when its optimizer state has another
structure.

Saves are asynchronous: `save` returns once the arrays are copied off the devices and Orbax commits in the background.
A step directory only appears under its final name once complete, so a save interrupted by `kill -9` is never listed.
Kept: the `max_to_keep` most recent checkpoints, the best one by main validation loss, and the steps listed in
`checkpoint.save_steps` when it is a list. No pickle anywhere: arrays are Orbax/TensorStore, the rest is JSON/YAML.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path

import absl.logging
import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from core.errors import CheckpointError, first_line
from core.trees import path_name
from models.fp8 import Fp8State
from models.gpt import GPT
from training.checkpoints.locate import KEYS, META
from training.checkpoints.storage import DISK_FULL_ERRNOS
from training.config import load_file_step
from training.step.precision import all_finite
from training.step.state import TrainState, eval_model

# Orbax reports routine events (read-only opens, ...) as warnings, and a failed background save as errors with the
# threads' tracebacks before the failure reaches the caller: the caller says it once, as a CheckpointError.
absl.logging.set_verbosity(absl.logging.FATAL)
# A restore that fails part way (a damaged array) drops Orbax's pending reads, and Python warns whenever the garbage
# collector meets one that it was never awaited: two lines on stderr beside the one that says what failed (seen once
# in four fresh-clone suites, in test_reliability's damaged latest checkpoint).
warnings.filterwarnings(
    "ignore", message="coroutine '_read_array_index_and_device_put' was never awaited", category=RuntimeWarning
)

PARTS = ("model", "opt_state", "progress")  # the TrainState, split by what a restore may want
STATS = "stats"  # training-statistics buffers: saved only by runs whose knobs made them (training/step/stats.py)
EVAL_MODEL = "eval_model"  # the weights to evaluate and export where they are not the parameters (schedule-free's x)
_finite_params = jax.jit(all_finite)  # a save checks the parameters first: it writes no NaN weights


def _val_loss(metrics: dict) -> float:
    return metrics["val_loss"]


def _unreadable_metrics(directory: Path) -> list[Path]:
    """The steps' metrics files in `directory` that are not JSON (a save killed as it wrote one, a damaged disk)."""
    damaged = []
    for path in sorted(directory.glob("*/metrics/metrics")):
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            damaged.append(path)
    return damaged


class Checkpointer:
    def __init__(
        self,
        directory: str | Path,
        max_to_keep: int | None = None,
        keep_steps: list[int] | None = None,
        read_only: bool = False,
    ) -> None:
        self.directory = Path(directory).absolute()
        keep = [
            policies.LatestN(max_to_keep),
            policies.BestN(get_metric_fn=_val_loss, reverse=True, n=1, keep_checkpoints_without_metrics=False),
        ]
        if keep_steps:
            keep.append(policies.CustomSteps(list(keep_steps)))
        options = ocp.CheckpointManagerOptions(
            best_fn=_val_loss,  # lets best_step() rank by metric (else it silently returns the latest step)
            best_mode="min",
            preservation_policy=None if read_only else policies.AnyPreservationPolicy(keep),
            enable_async_checkpointing=not read_only,
            create=not read_only,
            read_only=read_only,
            save_interval_steps=0 if read_only else 1,
            cleanup_tmp_directories=not read_only,  # leftovers of a save that was killed half-way
        )
        try:
            self._manager = ocp.CheckpointManager(
                self.directory, options=options, item_names=PARTS + (STATS, EVAL_MODEL, META)
            )
        except ValueError as e:  # a JSONDecodeError: Orbax reads every step's metrics (best_fn) as it opens
            if not (damaged := _unreadable_metrics(self.directory)):
                raise
            raise CheckpointError(
                f"checkpoint {damaged[0].parent.parent}: its metrics file {damaged[0]} does not read "
                f"({type(e).__name__}); corrupt or truncated? delete that file (the step keeps its arrays, without "
                f"the val loss that ranks it for `best`) or move the step out of {self.directory}"
            ) from None
        self._saving: int | None = None  # the step of the save in flight, for the line that says it failed
        self._failed: CheckpointError | None = None
        _drop_abandoned_io()  # a failed background save echoes from Orbax's threads before anyone is told

    # -- writing ---------------------------------------------------------------------------------------------------
    def save(self, state: TrainState, meta: dict, val_loss: float | None = None) -> bool:
        """Start an async save of `state` at its step. Refuses (returns False) when a parameter is not finite."""
        if not bool(_finite_params(eqx.filter(state.model, eqx.is_array))):
            return False
        step = int(state.step)
        if step in self._manager.all_steps():
            return True  # already saved (e.g. an eval and the end of the run fall on the same step)
        eval_weights = _eval_weights(state)
        with self._writing():  # a failure of the previous (background) save surfaces here
            self._saving = step
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    **{part: ocp.args.StandardSave(arrays) for part, arrays in _parts(state).items()},
                    **({STATS: ocp.args.StandardSave(state.stats)} if state.stats is not None else {}),
                    **({EVAL_MODEL: ocp.args.StandardSave(eval_weights)} if eval_weights is not None else {}),
                    **{META: ocp.args.JsonSave(meta)},
                ),
                metrics={"val_loss": val_loss} if val_loss is not None and math.isfinite(val_loss) else None,
                force=True,
            )
        return True

    def wait(self) -> None:
        with self._writing():
            self._manager.wait_until_finished()

    def close(self) -> None:
        if self._failed is None:  # after a failed save there is nothing left to finish
            self.wait()
            self._manager.close()

    @contextlib.contextmanager
    def _writing(self):
        """Orbax's save errors (a full disk, a file-size limit, ...) as one CheckpointError naming the step, the
        reason and the last complete checkpoint, which a failed save leaves as it was."""
        if self._failed is not None:
            raise self._failed
        try:
            yield
        except Exception as e:
            text = str(e)
            code = re.search(r"os_error_code='(\d+)'", text)
            full = code is not None and int(code.group(1)) in DISK_FULL_ERRNOS
            reason = (
                (os.strerror(int(code.group(1))) + (" (disk full?)" if full else "")) if code else first_line(e, 160)
            )
            complete = [s for s in self._manager.all_steps() if s != self._saving]
            last = f"the last complete one, step {max(complete)}, is intact" if complete else "no complete one yet"
            self._failed = CheckpointError(
                f"checkpoint.save_path: saving step {self._saving} to {self.directory} failed: {reason}; {last}. "
                + ("Free some space and rerun" if full else "Rerun once the cause is removed,")
                + " with checkpoint.load=auto to resume"
            )
            raise self._failed from None

    def set_aside(self, step: int, why: str = "damaged") -> Path:
        """Rename a step out of the way (never deleted) as `<step>.<why>-<time>`, so that the resumed run can save
        that step again: a damaged one, or one of the run's past that a resume from an older step trains again."""
        aside = self.directory / f"{step}.{why}-{time.strftime('%Y%m%d-%H%M%S')}"
        (self.directory / str(step)).rename(aside)
        self._manager.reload()
        return aside

    def reload(self) -> None:
        """List the steps on disk again (another process has renamed some)."""
        self._manager.reload()

    # -- reading ---------------------------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def resolve(self, load_file: str, keys: tuple[str, str] = KEYS) -> int:
        """`latest`, `best` or a step number -> a step that exists here. `keys`: what names the path and the step in
        the messages (locate.KEYS)."""
        steps, (where, which) = self.steps(), keys
        if not steps:
            raise CheckpointError(f"{where}: {self.directory} holds no complete checkpoint")
        if load_file == "latest":
            return steps[-1]
        if load_file == "best":
            best = self._manager.best_step()
            return best if best is not None else steps[-1]
        step = load_file_step(load_file)
        if step is None:
            raise CheckpointError(f"{which}: must be latest, best or a step number; got {load_file!r}")
        if step not in steps:
            raise CheckpointError(
                f"{which}: step {step} is not in {self.directory}; it has {', '.join(map(str, steps))}"
            )
        return step

    def read_meta(self, step: int) -> dict:
        path = self.directory / str(step) / META / "metadata"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint {self.directory}/{step}: metadata unreadable ({type(e).__name__}); corrupt or truncated?"
            ) from None

    def restore(self, step: int, like: TrainState, parts: tuple[str, ...] = PARTS) -> TrainState:
        """`like` (a TrainState on the target devices) with `parts` replaced by the checkpoint's at `step`.

        Arrays come back in the shardings of `like`'s, whatever device layout the checkpoint was written with.
        """
        targets = _parts(like)
        if "progress" in parts:
            targets["progress"] = self._progress_as_saved(step, targets["progress"])
        restored = {part: self._restore_part(step, part, arrays) for part, arrays in targets.items() if part in parts}
        model = eqx.combine(restored["model"], like.model) if "model" in restored else like.model
        progress = restored.get("progress", _parts(like)["progress"])
        fp8 = _fp8_for_run(progress.get("fp8"), like.fp8)
        opt_state = restored.get("opt_state", like.opt_state)
        stats = like.stats
        # Statistics buffers come back with the progress when the checkpoint has them and this run's knobs want
        # them; a checkpoint saved with other knobs (or none) starts them fresh.
        if "progress" in parts and stats is not None and (self.directory / str(step) / STATS).is_dir():
            try:
                stats = self._restore_part(step, STATS, stats)
            except CheckpointError:
                stats = like.stats
        return type(like)(
            step=progress["step"],
            model=model,
            opt_state=opt_state,
            key=progress["key"],
            loss_scale=progress["loss_scale"],
            stats=stats,
            fp8=fp8,
        )

    def _progress_as_saved(self, step: int, progress: dict) -> dict:
        """The progress to restore, its FP8 amax histories as the checkpoint holds them (system.dtype and
        system.fp8_amax_history named on a resume's command line win over the saved ones: _fp8_for_run)."""
        from etils import epath

        try:
            saved = ocp.StandardCheckpointHandler().metadata(epath.Path(self.directory / str(step) / "progress"))
            history = saved["fp8"]["history"] if "fp8" in saved else None
        except Exception:  # unreadable metadata: the restore itself says what is wrong
            return progress
        progress = {k: v for k, v in progress.items() if k != "fp8"}
        if history is not None:
            sharding = progress["step"].sharding  # replicated, as the histories are
            progress["fp8"] = Fp8State(jax.ShapeDtypeStruct(tuple(history.shape), history.dtype, sharding=sharding))
        return progress

    def restore_model(self, step: int, like: GPT) -> GPT:
        """Only the parameters, into the structure and shardings of the model `like` (sampling, export); `like` may
        be abstract (ShapeDtypeStruct leaves with shardings), so the full model is never built twice."""
        is_leaf = lambda x: isinstance(x, (jax.Array, jax.ShapeDtypeStruct))  # noqa: E731
        part = EVAL_MODEL if (self.directory / str(step) / EVAL_MODEL).is_dir() else "model"
        restored = self._restore_part(step, part, eqx.filter(like, is_leaf))
        return eqx.combine(restored, eqx.filter(like, is_leaf, inverse=True))

    def _restore_part(self, step: int, part: str, arrays: chex.ArrayTree) -> chex.ArrayTree:
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), arrays)
        try:
            try:
                return self._manager.restore(step, args=ocp.args.Composite(**{part: ocp.args.StandardRestore(target)}))[
                    part
                ]
            except Exception:
                older = _restore_from_before_new_fields(self.directory / str(step) / part, target)
                if older is None:
                    raise
                return older
        except Exception as e:  # TensorStore/Orbax raise many types for missing, damaged or mismatched files
            if not (self.directory / str(step) / part).is_dir():
                raise CheckpointError(
                    f"checkpoint {self.directory}/{step}: its {part} is missing (an incomplete or damaged checkpoint)"
                ) from None
            # the first line only (Orbax's tree mismatch ends it with a colon before its listing)
            reason = first_line(e, 160, str(e).split(" See full TensorStore details")[0]).rstrip(" :")
            hint = {
                "model": "a different model, or a corrupt/truncated checkpoint",
                EVAL_MODEL: "a different model",
                "opt_state": "a different optimizer? checkpoint.overwrite_optimizer=True starts a fresh one",
                "progress": "corrupt or truncated?",
                STATS: "other statistics knobs",
            }[part]
            raise CheckpointError(
                f"checkpoint {self.directory}/{step}: its {part} does not restore ({hint}): {reason}"
            ) from None


def _restore_from_before_new_fields(path: Path, target: chex.ArrayTree) -> chex.ArrayTree | None:
    """A checkpoint saved before the model gained its optional parameters (models/gpt.py: an untied head, QK-norm;
    None-valued fields in a GPT-2 model) holds the same arrays under the same names but no entry for those Nones,
    which Orbax's strict restore refuses: restore it partially, when its arrays are exactly the target's (names and
    shapes; Orbax checks dtypes). None when they are not."""
    from etils import epath

    try:

        def named_shapes(tree: chex.ArrayTree) -> dict[str, tuple[int, ...]]:
            return {path_name(p): tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}

        if named_shapes(ocp.StandardCheckpointHandler().metadata(epath.Path(path))) != named_shapes(target):
            return None
        args = ocp.args.PyTreeRestore(
            target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
        )
        return ocp.PyTreeCheckpointer().restore(epath.Path(path), args=args)
    except Exception:  # whatever else differs: the strict restore's error is the one to report
        return None


def _drop_abandoned_io() -> None:
    """A restore or save that fails leaves TensorStore reads and writes in flight; when they finish, their callbacks
    find Orbax's event loop closed (or the interpreter shutting down), and Python would print a traceback for each
    (or asyncio "Future exception was never retrieved"). The failure is reported once, as a CheckpointError; these
    echoes of it are dropped."""
    if getattr(sys.unraisablehook, "drops_abandoned_io", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        echo = isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"
        if not (echo or _from_orbax(unraisable)):
            previous(unraisable)

    hook.drops_abandoned_io = True
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(lambda record: "exception was never retrieved" not in record.getMessage())


def _from_orbax(unraisable: sys.UnraisableHookArgs) -> bool:
    """Raised by Orbax's code: the object's repr names it, or a coroutine's or the traceback's frames are Orbax's."""
    files, tb = [], unraisable.exc_traceback
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    code = getattr(unraisable.object, "cr_code", None)
    files += [code.co_filename] if code is not None else []
    return "orbax" in repr(unraisable.object) or any("orbax" in f for f in files)


def _eval_weights(state: TrainState) -> GPT | None:
    """The evaluated weights (training/step/state.py eval_model) when they are not the parameters; else None."""
    evaluated = eval_model(state)
    return None if evaluated is state.model else eqx.filter(evaluated, eqx.is_array)


def _fp8_for_run(saved: Fp8State | None, wanted: Fp8State | None) -> Fp8State | None:
    """The run's FP8 state from the checkpoint's: none where the run does not compute in FP8; fresh histories where
    the checkpoint has none (it was not FP8); else the saved amaxes, newest first, cut to or padded (with zeros: no
    amax yet) to the run's history length, with the run's margin."""
    if wanted is None or saved is None:
        return wanted
    steps = wanted.history.shape[-1]
    history = saved.history[..., :steps]
    history = jnp.pad(history, [(0, 0)] * (history.ndim - 1) + [(0, steps - history.shape[-1])])
    return Fp8State(jax.device_put(history, wanted.history.sharding), wanted.margin)


def _parts(state: TrainState) -> dict[str, chex.ArrayTree]:
    return {
        "model": eqx.filter(state.model, eqx.is_array),
        "opt_state": state.opt_state,
        "progress": {
            "step": state.step,
            "key": state.key,
            "loss_scale": state.loss_scale,
            **({"fp8": state.fp8} if state.fp8 is not None else {}),
        },
    }
