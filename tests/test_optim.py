"""Learning-rate schedules, weight-decay masks and every optimizer."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models.config import GPTConfig
from models.gpt import GPT
from optimizers import OPTIMIZERS, applied_lr_of, build_optimizer, build_schedule, grad_norm_of
from training.config import load_config
from training.step.losses import mean_loss

PEAK, FLOOR, WARMUP, STEPS = 1e-3, 1e-4, 10, 100


def schedule(name, **extra):
    overrides = [
        f"optimizer/lr_config={name}",
        f"optimizer.lr_config.lr={PEAK}",
        f"optimizer.lr_config.warmup={WARMUP}",
        f"train.max_steps={STEPS}",
    ] + [f"optimizer.lr_config.{k}={v}" for k, v in extra.items()]
    cfg = load_config(overrides)
    return build_schedule(cfg.optimizer.lr_config, STEPS)


@pytest.mark.parametrize("name", ["constant", "linear", "cosine", "trapezoid", "piecewise_linear"])
def test_warmup_starts_above_zero_and_reaches_the_peak(name):
    extra = {"min_lr_ratio": FLOOR / PEAK} if name not in ("constant", "piecewise_linear") else {}
    if name == "piecewise_linear":  # the preset's points (400, 800) lie past these 100 steps: refused
        extra = {"boundaries": "[40,80]", "boundary_lrs": f"[{PEAK / 2},{FLOOR}]"}
    s = schedule(name, **extra)
    assert float(s(0)) == pytest.approx(PEAK / WARMUP)
    assert float(s(WARMUP // 2 - 1)) == pytest.approx(PEAK / 2)
    assert float(s(WARMUP - 1)) == pytest.approx(PEAK)


@pytest.mark.parametrize("name,end", [("constant", PEAK), ("linear", FLOOR), ("cosine", FLOOR), ("trapezoid", FLOOR)])
def test_schedules_end_at_their_floor(name, end):
    s = schedule(name, min_lr_ratio=FLOOR / PEAK) if name != "constant" else schedule(name)
    assert float(s(STEPS)) == pytest.approx(end, rel=1e-5)
    assert float(s(10 * STEPS)) == pytest.approx(end, rel=1e-5)


@pytest.mark.parametrize("name", ["linear", "cosine", "trapezoid"])
def test_a_warmup_as_long_as_the_schedule_ends_it_at_the_floor(name):
    """Past the schedule's steps it holds its end, the floor: one step at the peak too many had the decay's length
    at least 1."""
    cfg = load_config(
        [f"optimizer/lr_config={name}", f"optimizer.lr_config.warmup={STEPS}", f"train.max_steps={STEPS}"]
    )
    s = build_schedule(cfg.optimizer.lr_config, STEPS)
    floor = cfg.optimizer.lr_config.min_lr_ratio * cfg.optimizer.lr_config.lr
    assert float(s(STEPS - 1)) == pytest.approx(cfg.optimizer.lr_config.lr) and floor > 0
    assert float(s(STEPS)) == pytest.approx(floor) and float(s(STEPS + 5)) == pytest.approx(floor)


def test_cosine_is_halfway_at_the_middle_of_the_decay():
    s = schedule("cosine", min_lr_ratio=FLOOR / PEAK)
    middle = WARMUP + (STEPS - WARMUP) // 2
    assert float(s(middle)) == pytest.approx((PEAK + FLOOR) / 2, rel=1e-4)


def test_trapezoid_is_flat_until_the_final_decay():
    s = schedule("trapezoid", min_lr_ratio=0.0, decay_fraction=0.2)
    assert float(s(WARMUP)) == pytest.approx(PEAK) and float(s(79)) == pytest.approx(PEAK)
    assert float(s(90)) == pytest.approx(PEAK / 2, rel=1e-4)


def test_a_trapezoids_decay_longer_than_the_warmup_leaves_still_ends_at_the_floor():
    """A decay of 0.95 of the run after a warmup of 10 of 100 steps: it starts at the warmup's end and reaches the
    floor at the run's end (not 0.05 of the way short)."""
    s = schedule("trapezoid", min_lr_ratio=FLOOR / PEAK, decay_fraction=0.95)
    assert float(s(WARMUP)) == pytest.approx(PEAK) and float(s(STEPS)) == pytest.approx(FLOOR, rel=1e-5)
    assert float(s(WARMUP + (STEPS - WARMUP) // 2)) == pytest.approx((PEAK + FLOOR) / 2, rel=1e-4)


def test_piecewise_linear_goes_through_its_points():
    s = schedule("piecewise_linear", boundaries="[20,60]", boundary_lrs="[5e-4,1e-4]")
    assert float(s(WARMUP + 20)) == pytest.approx(5e-4)
    assert float(s(WARMUP + 10)) == pytest.approx(7.5e-4)
    assert float(s(WARMUP + 60)) == pytest.approx(1e-4) and float(s(1000)) == pytest.approx(1e-4)


def tiny_model():
    return GPT.init(GPTConfig(vocab_size=259, n_layer=2, n_head=2, n_embd=32, context_size=32), jax.random.PRNGKey(0))


def test_weight_decay_touches_matrices_only():
    mask = tiny_model().weight_decay_mask()
    assert mask.wte and mask.blocks.qkv.weight and mask.blocks.fc.weight and mask.blocks.mlp_proj.weight
    assert not mask.wpe and not mask.blocks.qkv.bias and not mask.blocks.ln1.weight and not mask.ln_f.bias


@pytest.mark.parametrize("name", ["adamw", "adam", "sgdm", "nadam", "rmsprop", "lion", "muon"])
def test_weight_decay_moves_only_masked_parameters(name):
    model = tiny_model()
    cfg = load_config([f"optimizer={name}", "optimizer.weight_decay=0.5", "optimizer.grad_clip=0"])
    opt = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 100), model, 1)
    params = eqx.filter(model, eqx.is_array)
    updates, _ = jax.jit(lambda p: opt.update(jax.tree.map(jnp.zeros_like, p), opt.init(p), p))(params)
    moved = jax.tree.map(lambda u: bool(jnp.any(u != 0)), updates)
    assert moved.wte and moved.blocks.fc.weight
    assert not moved.wpe and not moved.blocks.fc.bias and not moved.ln_f.weight


def successor_batch(vocab: int = 50, rows: int = 32, length: int = 33, seed: int = 0):
    """Sequences where each token fixes the next (a random permutation of the ids), and the best loss a model that
    does not read its input tokens can reach on them: the entropy of the targets at each position (it can learn
    which ids occur where, never which id follows which)."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(vocab)
    x = np.zeros((rows, length), np.int64)
    x[:, 0] = rng.integers(0, vocab, rows)
    for t in range(length - 1):
        x[:, t + 1] = successor[x[:, t]]

    def entropy(ids):
        share = np.bincount(ids, minlength=vocab) / len(ids)
        return -float(np.sum(share[share > 0] * np.log(share[share > 0])))

    blind = np.mean([entropy(x[:, t]) for t in range(1, length)])
    x = jnp.asarray(x, jnp.int32)
    return {"inputs": x[:, :-1], "targets": x[:, 1:], "loss_mask": jnp.ones((rows, length - 1))}, blind


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_learns_what_the_context_predicts_and_resumes_bitwise(name, tmp_path):
    """30 steps take every optimizer well below the best loss of a model blind to its input tokens (merely lowering
    the loss, as learning which ids occur does, proves little). And the train state at step 2 (the optimizer's whole
    state in it), saved as an Orbax checkpoint and restored into a fresh state, continues bit for bit: 2 more steps
    from it give the parameters and optimizer state of step 4 of the run never interrupted. (One compiled step
    serves both.)"""
    from training.checkpoints.checkpointer import Checkpointer
    from training.step.state import TrainState

    model = tiny_model()
    lr = {
        "sgdm": 0.3,
        "lion": 6e-3,
        "muon": 0.08,
        "rmsprop": 4e-3,
        "adafactor": 0.1,
        "scion": 3.6e-4,
        "sophia": 1e-2,
        "prodigy": 1.0,  # the reference's lr, which multiplies the step size it estimates
        "dadapt_adamw": 1.0,
        "schedule_free_adamw": 1.0,  # the three below take no lr (it stays 1): their own keys, in `own`
        "schedule_free_sgd": 1.0,
        "cocob": 1.0,
    }.get(name, 1e-2)
    own = {  # the methods that set their own step size: theirs, for 30 steps
        "prodigy": ["optimizer.d0=1e-3"],
        "dadapt_adamw": ["optimizer.d0=3e-3"],  # no bias correction: starts slower
        "schedule_free_adamw": ["optimizer.sf_lr=1e-2", "optimizer.sf_warmup=0"],
        "schedule_free_sgd": ["optimizer.sf_lr=1.0", "optimizer.sf_warmup=5"],
        "cocob": ["optimizer.alpha=100"],  # the preset's 800 (the board's, 80 steps) bets too little for 30
    }.get(name, [])
    cfg = load_config(
        [
            f"optimizer={name}",
            "optimizer/lr_config=constant",
            f"optimizer.lr_config.lr={lr}",
            "optimizer.lr_config.warmup=0",
            *own,
        ]
    )
    opt = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 100), model, 1)
    batch, blind_loss = successor_batch()

    @eqx.filter_jit
    def step(state):
        loss, grads = eqx.filter_value_and_grad(mean_loss)(state.model, batch, None, jnp.float32)
        loss_of = lambda p: mean_loss(eqx.combine(p, state.model), batch, None, jnp.float32)  # noqa: E731 (Sophia)
        updates, opt_state = opt.update(grads, state.opt_state, eqx.filter(state.model, eqx.is_array), obj_fn=loss_of)
        new = eqx.tree_at(
            lambda s: (s.step, s.model, s.opt_state),
            state,
            (state.step + 1, eqx.apply_updates(state.model, updates), opt_state),
        )
        return new, loss

    # committed to the device, as the restored state will be: both then call the one compiled step
    state = fresh = jax.device_put(TrainState.create(model, opt, jax.random.PRNGKey(0)), jax.devices()[0])
    losses, saved = [], {}
    for n in range(30):
        if n in (2, 4):
            saved[n] = state
        state, loss = step(state)
        losses.append(float(loss))
    assert losses[-1] < blind_loss - 1.0, (blind_loss, losses)

    saver = Checkpointer(tmp_path / "ckpt")
    assert saver.save(saved[2], {"step": 2})
    saver.close()
    restored = Checkpointer(tmp_path / "ckpt", read_only=True).restore(2, fresh)  # into the state before step 1
    resumed = step(step(restored)[0])[0]
    straight = saved[4]
    leaves = jax.tree.leaves((eqx.filter(resumed.model, eqx.is_array), resumed.opt_state))
    for a, b in zip(
        leaves, jax.tree.leaves((eqx.filter(straight.model, eqx.is_array), straight.opt_state)), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(resumed.model.blocks.fc.weight, model.blocks.fc.weight)


def optax_reference(name, o, schedule, model):
    """Each optimizer as optax writes it, with the schedule inside (what `build_optimizer` must equal)."""
    decay = lambda p: model.weight_decay_mask()  # noqa: E731
    l2 = optax.add_decayed_weights(o.weight_decay, decay)
    if name == "muon":
        matrices = model.block_matrices_mask()
        dims = lambda ps: jax.tree.map(  # noqa: E731
            lambda w: optax.contrib.MuonDimensionNumbers(1, tuple(range(2, w.ndim))), ps
        )
        return optax.partition(
            {
                "muon": optax.contrib.muon(
                    schedule,
                    beta=o.momentum,
                    nesterov=o.nesterov,
                    weight_decay=o.weight_decay,
                    muon_weight_dimension_numbers=dims,
                ),
                "adamw": optax.adamw(
                    lambda c: o.groups["adam"]["lr_multiplier"] * schedule(c),
                    o.beta1,
                    o.beta2,
                    o.eps,
                    weight_decay=o.weight_decay,
                    mask=lambda p: jax.tree.map(lambda d, m: d and not m, decay(p), matrices),
                ),
            },
            lambda p: jax.tree.map(lambda m: "muon" if m else "adamw", matrices),
        )
    return {
        "adamw": lambda: optax.adamw(schedule, o.beta1, o.beta2, o.eps, weight_decay=o.weight_decay, mask=decay),
        "adam": lambda: optax.chain(l2, optax.adam(schedule, o.beta1, o.beta2, o.eps)),
        "nadam": lambda: optax.chain(l2, optax.nadam(schedule, o.beta1, o.beta2, o.eps)),
        "sgdm": lambda: optax.chain(l2, optax.sgd(schedule, momentum=o.momentum, nesterov=o.nesterov)),
        "rmsprop": lambda: optax.chain(l2, optax.rmsprop(schedule, decay=o.decay, eps=o.eps)),
        "lion": lambda: optax.lion(schedule, o.beta1, o.beta2, weight_decay=o.weight_decay, mask=decay),
    }[name]()


def follow(optimizer, params, steps: int = 6):
    """Parameters and optimizer state after `steps` updates with the same random gradients whatever the optimizer."""
    state = optimizer.init(params)
    for i in range(steps):
        grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(i), x.shape), params)
        updates, state = optimizer.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


@pytest.mark.parametrize("name", ["adam", "adamw", "lion", "muon", "nadam", "rmsprop", "sgdm"])
def test_each_optimizer_is_optax_own_with_its_hyper_parameters_and_schedule(name):
    """The lr is applied once, after the optimizer (optimizers/__init__.py): over a warmup and decay, with every
    hyper-parameter off its default, the parameters follow optax's own optimizer with the schedule inside it."""
    from optimizers.registry import hyper_parameters

    model = tiny_model()
    # each shared key the optimizer reads (another's it refuses); RMSprop's momentum differs on purpose (docstring)
    shared = {"beta1": 0.8, "beta2": 0.9, "eps": 1e-6, "decay": 0.8, "nesterov": "true", "momentum": 0.7}
    shared |= {"momentum": 0} if name == "rmsprop" else {}
    reads = hyper_parameters(OPTIMIZERS[name])
    cfg = load_config(
        [
            f"optimizer={name}",
            "optimizer.grad_clip=0",
            "optimizer.weight_decay=0.3",
            "optimizer.lr_config.lr=0.01",
            "optimizer.lr_config.warmup=2",
            "train.max_steps=6",
            *(f"optimizer.{key}={value}" for key, value in shared.items() if key in reads),
        ]
        + (["optimizer.groups.adam.lr_multiplier=0.5"] if name == "muon" else [])
    )
    schedule = build_schedule(cfg.optimizer.lr_config, 6)
    ours, theirs = (
        build_optimizer(cfg.optimizer, schedule, model, 1),
        optax_reference(name, cfg.optimizer, schedule, model),
    )
    params = eqx.filter(model, eqx.is_array)
    (p_ours, s_ours), (p_theirs, _) = (follow(optimizer, params) for optimizer in (ours, theirs))
    moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(params)))
    assert moved > 1e-3
    for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_theirs)):
        # two differently composed chains (the lr after the optimizer, or inside it): a few ulp of params <= ~1
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(applied_lr_of(s_ours)) == pytest.approx(float(schedule(5)))


def test_rmsprops_momentum_is_optax_own_at_a_constant_lr():
    """The one hyper-parameter the test above holds at 0: RMSprop's momentum, where the two agree (constant lr)."""
    model = tiny_model()
    cfg = load_config(
        [
            "optimizer=rmsprop",
            "optimizer.grad_clip=0",
            "optimizer.momentum=0.7",
            "optimizer.decay=0.8",
            "optimizer.eps=1e-6",
            "optimizer/lr_config=constant",
            "optimizer.lr_config.lr=0.01",
            "optimizer.lr_config.warmup=0",
        ]
    )
    schedule = build_schedule(cfg.optimizer.lr_config, 6)
    ours = build_optimizer(cfg.optimizer, schedule, model, 1)
    theirs = optax.rmsprop(0.01, decay=0.8, eps=1e-6, momentum=0.7)
    params = eqx.filter(model, eqx.is_array)
    (p_ours, _), (p_theirs, _) = (follow(optimizer, params) for optimizer in (ours, theirs))
    for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_gradient_clipping_scales_a_large_gradient_down_to_the_threshold():
    """optimizer.grad_clip: a gradient whose global norm is above it is scaled to that norm, one below it is left
    alone; the logged gradient norm is the norm before clipping. (Plain SGD: the update is -lr x the gradient.)"""
    model = tiny_model()
    cfg = load_config(
        [
            "optimizer=sgdm",
            "optimizer.momentum=0",
            "optimizer.weight_decay=0",
            "optimizer.grad_clip=0.5",
            "optimizer/lr_config=constant",
            "optimizer.lr_config.lr=0.1",
            "optimizer.lr_config.warmup=0",
        ]
    )
    opt = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 10), model, 1)
    params = eqx.filter(model, eqx.is_array)
    grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(0), x.shape), params)
    norm = float(optax.global_norm(grads))
    assert norm > 10
    update = jax.jit(opt.update)
    for scale, applied in ((1.0, 0.5 / norm), (0.4 / norm, 1.0)):  # norm above the threshold, then 0.4 below it
        given = jax.tree.map(lambda g: scale * g, grads)
        updates, state = update(given, opt.init(params), params)
        for u, g in zip(jax.tree.leaves(updates), jax.tree.leaves(given)):
            np.testing.assert_allclose(u, -0.1 * applied * g, rtol=1e-5, atol=1e-9)  # float32 scalings: ~1e-7 rel
        assert float(grad_norm_of(state)) == pytest.approx(scale * norm, rel=1e-5)
