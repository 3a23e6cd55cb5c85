"""Checkpoints through Orbax, in-process: best and latest, max_to_keep, half-written saves. (Other device layouts:
test_scale_out.py and test_resume.py.)"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from core.errors import CheckpointError
from models.config import GPTConfig
from models.gpt import GPT
from training.checkpoints.checkpointer import Checkpointer
from training.step.precision import LossScale
from training.step.state import TrainState


@pytest.fixture(scope="module")
def state():
    model = GPT.init(GPTConfig(vocab_size=259, n_layer=1, n_head=2, n_embd=32, context_size=32), jax.random.PRNGKey(0))
    return TrainState.create(model, optax.MultiSteps(optax.adamw(1e-3), 2), jax.random.PRNGKey(1))


def at_step(state, step):
    return eqx.tree_at(lambda s: s.step, state, jnp.asarray(step, jnp.int32))


def saved_steps(directory):
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def test_best_and_latest_are_told_apart_after_a_worse_eval(state, tmp_path):
    ckpt = Checkpointer(tmp_path)
    for step, val in [(1, 3.0), (2, 2.0), (3, 2.5), (4, None)]:
        ckpt.save(at_step(state, step), {"step": step}, val_loss=val)
    ckpt.close()
    reader = Checkpointer(tmp_path, read_only=True)  # a fresh manager, as a resumed run opens it
    assert reader.resolve("latest") == 4
    assert reader.resolve("best") == 2
    assert reader.resolve("3") == 3
    with pytest.raises(CheckpointError, match="step 7 is not in"):
        reader.resolve("7")


def test_max_to_keep_keeps_the_latest_n_plus_the_best_plus_listed_steps(state, tmp_path):
    ckpt = Checkpointer(tmp_path, max_to_keep=2, keep_steps=[3])
    for step, val in enumerate([5.0, 1.0, 4.0, 3.0, 2.0, 6.0], start=1):
        ckpt.save(at_step(state, step), {"step": step}, val_loss=val)
    ckpt.close()
    assert saved_steps(tmp_path) == [2, 3, 5, 6]
    assert Checkpointer(tmp_path, read_only=True).resolve("best") == 2


@pytest.mark.gpu
def test_a_checkpoint_holds_the_whole_state_and_restores_it(tmp_path):
    """Every leaf comes back, scalars and integers included: the step, the PRNG key, MultiSteps' micro-step and
    update counters and its gradient accumulator, Adam's count and moments, the loss scale and its counters."""
    model = GPT.init(GPTConfig(vocab_size=259, n_layer=1, n_head=2, n_embd=32, context_size=32), jax.random.PRNGKey(0))
    optimizer = optax.MultiSteps(optax.adamw(1e-3), 2)
    saved = TrainState.create(model, optimizer, jax.random.PRNGKey(1))
    params = eqx.filter(model, eqx.is_array)
    opt_state = saved.opt_state
    for i in range(3):  # one real update and half of the next: counters at 1, the accumulator holding a gradient
        grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(i), x.shape), params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    saved = TrainState(
        step=jnp.asarray(5, jnp.int32),
        model=eqx.combine(params, model),
        opt_state=opt_state,
        key=jax.random.PRNGKey(7),
        loss_scale=LossScale(jnp.asarray(1024.0), jnp.asarray(7, jnp.int32), jnp.asarray(2, jnp.int32)),
    )
    fresh = TrainState.create(GPT.init(model.cfg, jax.random.PRNGKey(3)), optimizer, jax.random.PRNGKey(4))
    saved_leaves, fresh_leaves = (jax.tree.leaves(eqx.filter(s, eqx.is_array)) for s in (saved, fresh))
    assert len(saved_leaves) == len(fresh_leaves)
    assert not any(np.array_equal(a, b) for a, b in zip(saved_leaves, fresh_leaves))  # a leaf left alone would show

    ckpt = Checkpointer(tmp_path)
    ckpt.save(saved, {"step": 5, "note": "hello"}, val_loss=1.0)
    ckpt.close()
    reader = Checkpointer(tmp_path, read_only=True)
    restored = reader.restore(5, fresh)
    assert reader.read_meta(5) == {"step": 5, "note": "hello"}
    assert jax.tree.structure(restored) == jax.tree.structure(saved)
    for a, b in zip(jax.tree.leaves(eqx.filter(restored, eqx.is_array)), saved_leaves):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_non_finite_parameters_are_never_written(state, tmp_path):
    broken = eqx.tree_at(lambda s: s.model.wpe, at_step(state, 1), state.model.wpe.at[0, 0].set(jnp.nan))
    ckpt = Checkpointer(tmp_path)
    assert ckpt.save(broken, {"step": 1}) is False
    ckpt.close()
    assert saved_steps(tmp_path) == []


def test_a_half_written_checkpoint_is_never_picked(state, tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(at_step(state, 2), {"step": 2}, val_loss=1.0)
    ckpt.close()
    # What a save killed half-way leaves behind: Orbax's temporary directory, never renamed to its step.
    partial = tmp_path / "3.orbax-checkpoint-tmp-1234567"
    (partial / "model").mkdir(parents=True)
    (partial / "model" / "junk").write_bytes(b"\0" * 100)
    assert Checkpointer(tmp_path, read_only=True).resolve("latest") == 2
    resumed = Checkpointer(tmp_path)  # a resumed run reopens the directory for writing ...
    resumed.save(at_step(state, 4), {"step": 4})  # ... and its first save clears the leftover
    resumed.close()
    assert not partial.exists() and saved_steps(tmp_path) == [2, 4]


def test_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        Checkpointer(tmp_path, read_only=True).resolve("latest")


def test_a_failed_save_says_free_space_only_when_the_disk_is_full(tmp_path):
    """A save that fails for another reason (a bug, a permission) said 'Free some space' too."""
    for error, ending in (
        (RuntimeError("Cannot serialize host local jax.Array"), "Rerun once the cause is removed, with"),
        (
            OSError("write failed: os_error_code='28'"),
            "No space left on device (disk full?); no complete one yet. Free some space and rerun with",
        ),
    ):
        ck = Checkpointer(tmp_path / str(len(ending)))
        ck._saving = 4
        with pytest.raises(CheckpointError) as e, ck._writing():
            raise error
        assert str(e.value).startswith(f"checkpoint.save_path: saving step 4 to {tmp_path / str(len(ending))} failed: ")
        assert str(e.value).endswith(f"{ending} checkpoint.load=auto to resume"), str(e.value)


def test_a_resume_named_into_or_out_of_fp8_or_to_another_history_length_restores(state, tmp_path):
    """system.dtype and system.fp8_amax_history named on a resume's command line win over the saved ones, but the
    progress did not restore ("corrupt or truncated?"): the saved histories' shape, or their presence, was not the
    run's. The newest amaxes now carry over, cut or padded with zeros (no amax yet); into FP8 they start fresh."""
    from models.fp8 import Fp8Recipe, Fp8State

    fp8 = lambda steps: TrainState.create(  # noqa: E731
        state.model, optax.MultiSteps(optax.adamw(1e-3), 2), jax.random.PRNGKey(1), fp8=Fp8Recipe(steps, 1)
    )
    saved = fp8(6)
    amaxes = jnp.arange(1.0, 1 + saved.fp8.history.size).reshape(saved.fp8.history.shape)
    saved = eqx.tree_at(lambda s: s.fp8, at_step(saved, 5), Fp8State(amaxes, 1))
    for name, one in (("fp8", saved), ("bf16", at_step(state, 5))):
        writer = Checkpointer(tmp_path / name)
        writer.save(one, {"step": 5})
        writer.close()
    reader = Checkpointer(tmp_path / "fp8", read_only=True)
    shorter, longer = reader.restore(5, fp8(4)), reader.restore(5, fp8(8))
    np.testing.assert_array_equal(shorter.fp8.history, amaxes[..., :4])  # the newest four
    np.testing.assert_array_equal(longer.fp8.history[..., :6], amaxes)
    assert not np.any(longer.fp8.history[..., 6:]) and longer.fp8.margin == 1
    out = reader.restore(5, state)
    assert out.fp8 is None and int(out.step) == 5
    into = Checkpointer(tmp_path / "bf16", read_only=True).restore(5, fp8(4))
    assert int(into.step) == 5 and into.fp8.history.shape == (1, 4, 3, 4) and not np.any(into.fp8.history)


def test_the_reads_a_failed_restore_dropped_say_nothing_when_collected():
    """A restore that failed part way left Orbax's pending reads unawaited; collected later, each printed Python's
    `coroutine ... was never awaited` warning (two lines) beside the run's one error line."""
    import subprocess
    import sys

    code = (
        "import gc, training.checkpoints.checkpointer\n"
        "async def _read_array_index_and_device_put(): pass\n"
        "_read_array_index_and_device_put()\n"
        "gc.collect()\n"
    )
    result = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
