"""The compiled train step: token-exact accumulation with optax.MultiSteps (adamw with accumulation against the
1-device curve: test_scale_out.py), the lr it applies, z-loss, and sharding
over 8 host devices."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import build, tiny_overrides
from training.checkpoints.checkpointer import Checkpointer
from training.checkpoints.resume import RunPlan, Source, restore_state
from training.distributed.sharding import put_batch
from training.loop.session import _token_weighted
from training.step.losses import mean_loss, token_losses


def run_steps(overrides, steps=3):
    parts = build(overrides)
    losses = [float(parts.step(s)["loss"]) for s in range(steps)]
    return losses, jax.device_get(eqx.filter(parts.state.model, eqx.is_array)), parts


def max_param_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_step_sharded_over_8_devices_equals_the_1_device_step(data_cache):
    base = tiny_overrides(data_cache, "train.batch_size=8")
    single = run_steps(base + ["system.num_devices=1"])
    sharded = run_steps(base + ["system.num_devices=8"])
    # two programs (1 device, 8 with cross-device sums) over 3 adamw steps: sums in other orders, a few ulp of losses
    # ~5 (~1e-6), which Adam's m/sqrt(v) grows in small gradients (measured 7e-7); 1e-4 as tests/test_scale_out.py
    np.testing.assert_allclose(single[0], sharded[0], atol=1e-4)
    assert max_param_diff(single[1], sharded[1]) <= 1e-4
    for (*_, parts), devices in ((single, 1), (sharded, 8)):  # the second step really ran on 8 devices
        batch = put_batch(parts.data.train.batch(0), parts.mesh)["inputs"]
        assert [shard.data.shape for shard in batch.addressable_shards] == [(1, 8 // devices, 64)] * devices
        assert len(parts.state.model.wte.sharding.device_set) == devices


@pytest.mark.gpu
@pytest.mark.deterministic
def test_a_step_is_the_same_program_whatever_the_schedule_does_after_it(data_cache):
    """A 3-step run at a constant lr, and a 6-step run whose piecewise schedule holds that lr for 3 steps and then
    halves it (a schedule search's branch and the schedule it finds): the step is one program for both (the lr is its
    argument, not a constant of it), so steps 1-3 give the same losses bit for bit, on any CPU. With the schedule
    compiled into the step, the two programs differ and XLA:CPU's code for them can round differently."""
    common = ["optimizer.lr_config.lr=3e-3", "optimizer.lr_config.warmup=0"]
    short = build(tiny_overrides(data_cache, *common, "train.max_steps=3", "optimizer/lr_config=constant"))
    long = build(
        tiny_overrides(
            data_cache,
            *common,
            "train.max_steps=6",
            "optimizer/lr_config=piecewise_linear",
            "optimizer.lr_config.boundaries=[3,3,6]",
            "optimizer.lr_config.boundary_lrs=[3e-3,1.5e-3,1.5e-3]",
        )
    )
    batch = put_batch(short.data.train.batch(0), short.mesh)
    assert short.train_step.lower(short.state, batch).as_text() == long.train_step.lower(long.state, batch).as_text()
    short_metrics = [jax.device_get(short.step(s)) for s in range(3)]
    long_metrics = [jax.device_get(long.step(s)) for s in range(6)]
    # exactly: the assert above showed one program, so the same inputs give the same bits on any CPU
    assert [float(m["loss"]) for m in short_metrics] == [float(m["loss"]) for m in long_metrics[:3]]
    assert [float(m["lr"]) for m in long_metrics] == [np.float32(3e-3)] * 3 + [np.float32(1.5e-3)] * 3


@pytest.mark.gpu
def test_the_step_donates_the_old_state(data_cache):
    parts = build(tiny_overrides(data_cache))
    old = parts.state
    parts.step(0)
    assert old.model.wte.is_deleted() and int(parts.state.step) == 1


@pytest.mark.gpu
def test_training_lowers_the_loss_on_real_text(data_cache):
    parts = build(tiny_overrides(data_cache, "train.max_steps=30", "optimizer.lr_config.lr=3e-3"))
    losses = [float(parts.step(s)["loss"]) for s in range(30)]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses


def uneven_finetuning(tmp_path, data_cache, *extra):
    """Fine-tuning records whose completions are 1 byte or ~50: micro-batches of one record hold very different
    numbers of target tokens."""
    rows = [{"q": f"Say {i}:", "a": "a" if i % 2 else "ab" * 25} for i in range(64)]
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return tiny_overrides(
        data_cache,
        "dataset=json_files",
        f"dataset.files=[{tmp_path / 'qa.jsonl'}]",
        "dataset.prompt_column=q",
        "dataset.completion_column=a",
        "loss_masking=finetuning",
        "dataset.max_documents=null",
        "optimizer=sgdm",
        "optimizer.lr_config.lr=0.5",
        "optimizer.grad_clip=0",
        *extra,
    )


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
def test_every_target_token_counts_once_whatever_the_accumulation(tmp_path, data_cache):
    """Masked fine-tuning records, one per micro-batch, with 2 or ~50 target tokens: k = 4 micro-batches give the
    parameters one batch of 4 gives, and the step's loss is the mean over its target tokens, not over micro-batches."""
    base = uneven_finetuning(tmp_path, data_cache)
    accumulated = build(base + ["train.batch_size=1", "train.grad_accum_steps=4"])
    batch = accumulated.data.train.batch(0)
    sums = [
        token_losses(accumulated.state.model, jax.tree.map(lambda x: jnp.asarray(x[i]), batch), None, jnp.float32)
        for i in range(4)
    ]
    nll, tokens = (np.array([float(s[i]) for s in sums]) for i in (0, 1))
    assert tokens.max() >= 4 * tokens.min() > 0, tokens  # the micro-batches really are uneven
    token_weighted, mean_of_means = nll.sum() / tokens.sum(), np.mean(nll / tokens)
    assert abs(token_weighted - mean_of_means) > 1e-2  # what the test tells apart
    metrics = accumulated.step(0)
    # the compiled accumulating step against the eager per-record sums: float32 over ~100 tokens, ~1e-6; 1e-5
    assert float(metrics["loss"]) == pytest.approx(token_weighted, rel=1e-5)
    assert float(metrics["target_tokens"]) == tokens.sum()

    one_batch = build(base + ["train.batch_size=4", "train.grad_accum_steps=1"])
    for s in range(3):
        one_batch.step(s)
        if s:
            accumulated.step(s)
    params = [jax.device_get(eqx.filter(p.state.model, eqx.is_array)) for p in (accumulated, one_batch)]
    # two programs (4 micro-batches, one batch), 3 plain SGD steps: gradients a few ulp apart x lr 0.5, on weights
    # <= ~1 (measured 5e-7); 1e-5 leaves 20x
    assert max_param_diff(*params) <= 1e-5


def test_the_logged_interval_loss_weights_steps_by_their_target_tokens():
    fetched = [
        {"loss": 2.0, "target_tokens": 300.0},
        {"loss": 8.0, "target_tokens": 3.0},
        {"loss": float("nan"), "target_tokens": 50.0},
    ]  # a skipped step is left out
    assert _token_weighted(fetched, "loss") == pytest.approx((2.0 * 300 + 8.0 * 3) / 303)  # float64, other order


def sgd_overrides(data_cache, *extra):
    """Plain SGD (no momentum, decay or clipping) on a warmup: every step's lr differs and update = -lr x gradient."""
    return tiny_overrides(
        data_cache,
        "optimizer=sgdm",
        "optimizer.momentum=0",
        "optimizer.weight_decay=0",
        "optimizer.grad_clip=0",
        "optimizer/lr_config=linear",
        "optimizer.lr_config.lr=0.5",
        "optimizer.lr_config.warmup=8",
        *extra,
    )


def applied_lr(parts, step):
    """The lr step `step` really applied, measured from the parameters: -<Δp, g> / <g, g>."""
    batch = put_batch(parts.data.train.batch(step), parts.mesh)
    before = jax.device_get(eqx.filter(parts.state.model, eqx.is_array))
    grads = eqx.filter_grad(mean_loss)(parts.state.model, jax.tree.map(lambda x: x[0], batch), None, jnp.float32)
    metrics = parts.step(step)
    after = eqx.filter(parts.state.model, eqx.is_array)
    delta, g = (
        np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)])
        for t in (
            jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), after, before),
            eqx.filter(grads, eqx.is_array),
        )
    )
    return -float(delta @ g) / float(g @ g), metrics


@pytest.mark.gpu
@pytest.mark.usefixtures("float32_matmuls")
def test_z_loss_adds_exactly_its_term(data_cache):
    coefficient = 1e-2
    parts = build(sgd_overrides(data_cache, f"train.z_loss={coefficient}", "train.batch_size=4"))
    model = parts.state.model
    batch = jax.tree.map(lambda x: jnp.asarray(x[0]), parts.data.train.batch(0))
    batch["loss_mask"] = batch["loss_mask"].at[:, :10].set(0.0)  # only masked-in tokens count

    def by_hand(m):
        logits = np.asarray(eqx.filter_jit(lambda m, x: m(x))(m, batch["inputs"]), np.float64)
        log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        target = np.take_along_axis(logits, np.asarray(batch["targets"])[..., None], -1)[..., 0]
        mask = np.asarray(batch["loss_mask"])
        return ((log_z - target) * mask).sum() / mask.sum(), coefficient * (log_z**2 * mask).sum() / mask.sum()

    def objective(m):
        logits = m(batch["inputs"])
        log_z = jax.nn.logsumexp(logits, -1)
        target = jnp.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0]
        mask = batch["loss_mask"]
        return jnp.sum((log_z - target + coefficient * log_z**2) * mask) / jnp.sum(mask)

    nll, z_term = by_hand(model)
    grads = eqx.filter(eqx.filter_jit(eqx.filter_grad(objective))(model), eqx.is_array)  # compiled: 10 s op by op
    before = jax.device_get(eqx.filter(model, eqx.is_array))
    parts.state, metrics = parts.train_step(
        parts.state, put_batch(jax.tree.map(lambda x: np.asarray(x)[None], batch), parts.mesh)
    )
    # the step (float32) against the same formulas in float64 numpy from the float32 logits: ~1e-7 relative; 1e-5
    assert float(metrics["loss"]) == pytest.approx(nll, rel=1e-5)  # the cross-entropy, without the z term
    assert float(metrics["z_loss"]) == pytest.approx(z_term, rel=1e-5) and z_term > 1e-3
    lr = float(metrics["lr"])
    want = jax.tree.map(lambda p, g: p - lr * np.asarray(g), before, grads)
    # the step's update against lr x an eager gradient: lr (warmup) x a few ulp of gradients < 1, plus an ulp of the
    # weights (<= 1.2e-7 for LayerNorm's 1s; measured 7e-9): 1e-6
    assert max_param_diff(want, eqx.filter(parts.state.model, eqx.is_array)) <= 1e-6


def test_the_logged_lr_is_the_one_applied_after_overwrite_optimizer_and_a_skipped_step(data_cache, tmp_path):
    """checkpoint.overwrite_optimizer: a fresh optimizer state (here of another structure: momentum 0.9 -> none), the
    restored parameters, and the lr schedule at the restored step, not back at its warmup. Then a skipped
    (non-finite) step applies nothing and does not advance the schedule. The lr read from the optimizer state is,
    every time, the lr measured from the parameters' change."""
    first = build(sgd_overrides(data_cache, "optimizer.momentum=0.9"))
    for s in range(3):
        first.step(s)
    saver = Checkpointer(tmp_path / "ckpt")
    saver.save(first.state, {"step": 3})
    saver.close()
    second = build(
        sgd_overrides(
            data_cache,
            "checkpoint.load=True",  # a resume's keys (the plan below restores): refused without one
            f"checkpoint.load_path={tmp_path / 'ckpt'}",
            "checkpoint.overwrite_optimizer=True",
            "train.skip_nonfinite=true",
        )
    )
    plan = RunPlan(
        second.cfg,
        tmp_path,
        tmp_path / "ckpt",
        Source(Checkpointer(tmp_path / "ckpt", read_only=True), 3, {}),
        None,
        [],
    )
    second.state = restore_state(second.state, plan)
    assert (
        max_param_diff(eqx.filter(first.state.model, eqx.is_array), eqx.filter(second.state.model, eqx.is_array)) == 0
    )
    assert int(second.state.step) == 3 and int(optax.tree.get(second.state.opt_state, "lr_step")) == 3
    measured, metrics = applied_lr(second, 3)
    # measured from p' - p, which loses p's low bits (an ulp of p against lr x g) and uses an eager gradient; over
    # ~1e5 entries that averages to well under 1e-4. Against schedule(): float32 lr vs float64, ~1e-7 (approx's 1e-6)
    assert float(metrics["lr"]) == pytest.approx(measured, rel=1e-4)
    assert float(metrics["lr"]) == pytest.approx(float(second.schedule(3)))  # continues: warmup step 4 of 8

    batch = second.data.train.batch(4)
    batch["loss_mask"][0, 0, 0] = np.nan  # a non-finite step: skipped, nothing applied
    second.state, metrics = second.train_step(second.state, put_batch(batch, second.mesh))
    assert int(metrics["skipped_steps"]) == 1
    measured, metrics = applied_lr(second, 5)
    assert float(metrics["lr"]) == pytest.approx(measured, rel=1e-4)
    assert float(metrics["lr"]) == pytest.approx(float(second.schedule(4)))  # the skip did not advance it
    assert float(metrics["lr"]) != pytest.approx(float(second.schedule(5)))  # what schedule(step - 1) would say


def test_document_mask_reaches_the_train_and_eval_steps(data_cache, tmp_path):
    """dataset.document_mask=true: batches carry segment ids, and the same step's update changes with them."""
    for i in range(200):  # short documents: several in every window of 64 tokens
        (tmp_path / f"doc{i}.txt").write_text(f"doc {i} " * (1 + i % 4))
    models = {}
    for masked in (False, True):
        parts = build(
            tiny_overrides(
                data_cache,
                "dataset=text_files",
                f"dataset.files=[{tmp_path}]",
                "dataset.max_documents=null",
                "dataset.test_fraction=0",
                "dataset.val_fraction=0.3",
                f"dataset.document_mask={str(masked).lower()}",
                "train.grad_accum_steps=2",
                "train.batch_size=4",
            )
        )
        batch = parts.data.train.batch(0)
        assert ("segment_ids" in batch) == masked
        if masked:
            assert batch["segment_ids"][..., -1].min() >= 2
        eval_batch = next(iter(parts.data.evals["val"]))
        assert ("segment_ids" in eval_batch) == masked
        parts.step(0)
        models[masked] = parts.state.model
    # Positions restart at each document (none is 40 tokens long): the position embedding's late rows get no
    # gradient with the mask, and one without.
    late = slice(40, None)
    assert float(jnp.abs(models[True].wpe[late] - models[False].wpe[late]).max()) > 1e-4


def test_under_accumulation_the_optimizer_runs_at_the_steps_last_micro_batch_only():
    """optax.MultiSteps runs its inner optimizer at every micro-batch and keeps the last one's result: k times the
    optimizer's work a step (measured on gpt2-micro, k = 4: SOAP 1.69x and Muon 1.70x slower than once a step)."""
    from optimizers import only_at_last_micro_batch

    calls = []

    def update(updates, state, params=None, **extra):
        jax.debug.callback(lambda: calls.append(1))
        return jax.tree.map(lambda u: -u, updates), state

    counting = optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)
    params = {"w": jnp.ones(3)}
    for wrapped, last, runs in ((only_at_last_micro_batch(counting), True, 2), (counting, False, 8)):
        opt = optax.MultiSteps(wrapped, 4, use_grad_mean=False)
        state, calls[:] = opt.init(params), []
        step = jax.jit(lambda g, s, i: opt.update(g, s, params, **({"last_micro_batch": i == 3} if last else {})))
        moves = []
        for i in range(8):
            updates, state = step(params, state, jnp.asarray(i % 4))
            moves.append(float(updates["w"][0]))
        jax.effects_barrier()
        assert len(calls) == runs and moves == [0.0, 0.0, 0.0, -4.0] * 2  # the same updates: the sum, at the 4th


def test_the_train_step_runs_the_optimizer_inside_the_last_micro_batchs_branch(data_cache):
    """The pipeline's step passes which micro-batch is the last: the optimizer's arithmetic (AdamW's square roots,
    the clipping norm's) sits two conditionals deep, in MultiSteps' own (whether to skip the update: never, here)
    and in the last micro-batch's, not one deep, where every micro-batch ran it."""
    parts = build(tiny_overrides(data_cache, "train.grad_accum_steps=2", "train.batch_size=4"))
    batch = put_batch(parts.data.train.batch(0), parts.mesh)
    depths: dict[str, set[int]] = {}

    def walk(jaxpr, depth):
        for eqn in jaxpr.eqns:
            depths.setdefault(eqn.primitive.name, set()).add(depth)
            for value in eqn.params.values():
                for sub in value if isinstance(value, (list, tuple)) else [value]:
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner, depth + (eqn.primitive.name == "cond"))

    walk(jax.make_jaxpr(parts.train_step, static_argnums=2)(parts.state, batch, 0).jaxpr, 0)
    assert depths["sqrt"] == {2}
