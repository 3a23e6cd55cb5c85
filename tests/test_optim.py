"""Learning-rate schedules, weight-decay masks and every optimizer."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models.gpt import GPT, GPTConfig
from optimizers import OPTIMIZERS, applied_lr_of, build_optimizer, build_schedule
from training.config import load_config
from training.step import mean_loss

PEAK, FLOOR, WARMUP, STEPS = 1e-3, 1e-4, 10, 100


def schedule(name, **extra):
    overrides = [f"optimizer/lr_config={name}", f"optimizer.lr_config.lr={PEAK}", f"optimizer.lr_config.warmup={WARMUP}",
                 f"train.max_steps={STEPS}"] + [f"optimizer.lr_config.{k}={v}" for k, v in extra.items()]
    cfg = load_config(overrides)
    return build_schedule(cfg.optimizer.lr_config, STEPS)


@pytest.mark.parametrize("name", ["constant", "linear", "cosine", "trapezoid", "piecewise_linear"])
def test_warmup_starts_above_zero_and_reaches_the_peak(name):
    s = schedule(name, **({"min_lr": FLOOR} if name != "constant" and name != "piecewise_linear" else {}))
    assert float(s(0)) == pytest.approx(PEAK / WARMUP)
    assert float(s(WARMUP // 2 - 1)) == pytest.approx(PEAK / 2)
    assert float(s(WARMUP - 1)) == pytest.approx(PEAK)


@pytest.mark.parametrize("name,end", [("constant", PEAK), ("linear", FLOOR), ("cosine", FLOOR), ("trapezoid", FLOOR)])
def test_schedules_end_at_their_floor(name, end):
    s = schedule(name, min_lr=FLOOR) if name != "constant" else schedule(name)
    assert float(s(STEPS)) == pytest.approx(end, rel=1e-5)
    assert float(s(10 * STEPS)) == pytest.approx(end, rel=1e-5)


def test_cosine_is_halfway_at_the_middle_of_the_decay():
    s = schedule("cosine", min_lr=FLOOR)
    middle = WARMUP + (STEPS - WARMUP) // 2
    assert float(s(middle)) == pytest.approx((PEAK + FLOOR) / 2, rel=1e-4)


def test_trapezoid_is_flat_until_the_final_decay():
    s = schedule("trapezoid", min_lr=0.0, decay_fraction=0.2)
    assert float(s(WARMUP)) == pytest.approx(PEAK) and float(s(79)) == pytest.approx(PEAK)
    assert float(s(90)) == pytest.approx(PEAK / 2, rel=1e-4)


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
    updates, _ = opt.update(jax.tree.map(jnp.zeros_like, params), opt.init(params), params)
    moved = jax.tree.map(lambda u: bool(jnp.any(u != 0)), updates)
    assert moved.wte and moved.blocks.fc.weight
    assert not moved.wpe and not moved.blocks.fc.bias and not moved.ln_f.weight


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_lowers_the_loss(name):
    model = tiny_model()
    lr = {"sgdm": 0.3, "lion": 3e-4, "muon": 0.02}.get(name, 3e-3)
    cfg = load_config([f"optimizer={name}", "optimizer/lr_config=constant", f"optimizer.lr_config.lr={lr}",
                       "optimizer.lr_config.warmup=0"])
    opt = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 100), model, 1)
    x = jnp.asarray(np.random.default_rng(0).integers(0, 50, (4, 33)), jnp.int32)
    batch = {"inputs": x[:, :-1], "targets": x[:, 1:], "loss_mask": jnp.ones((4, 32))}

    @eqx.filter_jit
    def step(model, state):
        loss, grads = eqx.filter_value_and_grad(mean_loss)(model, batch, None, jnp.float32)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, loss

    state = opt.init(eqx.filter(model, eqx.is_array))
    losses = []
    for _ in range(15):
        model, state, loss = step(model, state)
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.3, losses


def optax_reference(name, o, schedule, model):
    """Each optimizer as optax writes it, with the schedule inside (what `build_optimizer` must equal)."""
    decay = lambda p: model.weight_decay_mask()  # noqa: E731
    l2 = optax.add_decayed_weights(o.weight_decay, decay)
    if name == "muon":
        matrices = model.block_matrices_mask()
        dims = lambda ps: jax.tree.map(  # noqa: E731
            lambda w: optax.contrib.MuonDimensionNumbers(1, tuple(range(2, w.ndim))), ps)
        return optax.partition(
            {"muon": optax.contrib.muon(schedule, beta=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay,
                                        muon_weight_dimension_numbers=dims),
             "adamw": optax.adamw(lambda c: o.adam_lr_ratio * schedule(c), o.beta1, o.beta2, o.eps,
                                  weight_decay=o.weight_decay,
                                  mask=lambda p: jax.tree.map(lambda d, m: d and not m, decay(p), matrices))},
            lambda p: jax.tree.map(lambda m: "muon" if m else "adamw", matrices))
    return {
        "adamw": lambda: optax.adamw(schedule, o.beta1, o.beta2, o.eps, weight_decay=o.weight_decay, mask=decay),
        "adam": lambda: optax.chain(l2, optax.adam(schedule, o.beta1, o.beta2, o.eps)),
        "nadam": lambda: optax.chain(l2, optax.nadam(schedule, o.beta1, o.beta2, o.eps)),
        "sgdm": lambda: optax.chain(l2, optax.sgd(schedule, momentum=o.momentum, nesterov=o.nesterov)),
        "rmsprop": lambda: optax.chain(l2, optax.rmsprop(schedule, decay=o.decay, eps=o.eps)),
        "lion": lambda: optax.lion(schedule, o.beta1, o.beta2, weight_decay=o.weight_decay, mask=decay),
    }[name]()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_each_optimizer_is_optax_own_with_its_hyper_parameters_and_schedule(name):
    """The lr is applied once, after the optimizer (optimizers/__init__.py): over a warmup and decay, with every
    hyper-parameter off its default, the parameters follow optax's own optimizer with the schedule inside it."""
    model = tiny_model()
    extra = ["optimizer.momentum=0"] if name == "rmsprop" else []  # RMSprop's momentum differs on purpose (docstring)
    cfg = load_config([f"optimizer={name}", "optimizer.grad_clip=0", "optimizer.beta1=0.8", "optimizer.beta2=0.9",
                       "optimizer.eps=1e-6", "optimizer.weight_decay=0.3", "optimizer.decay=0.8",
                       "optimizer.adam_lr_ratio=0.5", "optimizer.nesterov=true", "optimizer.lr_config.lr=0.01",
                       "optimizer.lr_config.warmup=2", "train.max_steps=6", *extra]
                      + ([] if name == "rmsprop" else ["optimizer.momentum=0.7"]))
    schedule = build_schedule(cfg.optimizer.lr_config, 6)
    ours, theirs = build_optimizer(cfg.optimizer, schedule, model, 1), optax_reference(name, cfg.optimizer, schedule, model)
    params = eqx.filter(model, eqx.is_array)
    p_ours, p_theirs, s_ours, s_theirs = params, params, ours.init(params), theirs.init(params)
    for i in range(6):
        g = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(i), x.shape), params)
        u, s_ours = ours.update(g, s_ours, p_ours)
        p_ours = optax.apply_updates(p_ours, u)
        u, s_theirs = theirs.update(g, s_theirs, p_theirs)
        p_theirs = optax.apply_updates(p_theirs, u)
    moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(params)))
    assert moved > 1e-3
    for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(applied_lr_of(s_ours)) == pytest.approx(float(schedule(5)))
