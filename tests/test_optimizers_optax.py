"""The optimizers taken from optax (nadamw, adafactor, signum, ademamix, cocob, dadapt_adamw, prodigy,
schedule_free_adamw, schedule_free_sgd, sophia): each builder's direction, applied to the tiny GPT's parameters for 3
steps (Sophia: 25, three refreshes of its Hessian estimate), follows its method's formula written out here in float64
numpy; weight decay touches the matrices only; every preset composes and builds."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from core.errors import ConfigError
from models.config import GPTConfig
from models.gpt import GPT
from optimizers import OPTIMIZERS, build_optimizer, build_schedule
from optimizers.registry import build_direction, hyper_parameter_values
from training.config import load_config

NEW = [
    "nadamw",
    "adafactor",
    "signum",
    "ademamix",
    "cocob",
    "dadapt_adamw",
    "prodigy",
    "schedule_free_adamw",
    "schedule_free_sgd",
]
STEPS = 3

MODEL = GPT.init(GPTConfig(vocab_size=16, n_layer=1, n_head=2, n_embd=8, context_size=8), jax.random.PRNGKey(0))
PARAMS = eqx.filter(MODEL, eqx.is_array)
TREEDEF = jax.tree.structure(PARAMS)
DECAYED = jax.tree.leaves(MODEL.weight_decay_mask())  # one bool per parameter leaf: a matrix
_rng = np.random.default_rng(0)
TARGET = [_rng.normal(size=p.shape) for p in jax.tree.leaves(PARAMS)]
NOISE = [[_rng.normal(size=p.shape) for p in jax.tree.leaves(PARAMS)] for _ in range(STEPS)]


def leaves64(tree):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


def gradient(params, t):
    """A noisy quadratic's gradient at `params` (leaves), step t: it depends on where the method put the weights."""
    return [p - target + 0.5 * noise for p, target, noise in zip(params, TARGET, NOISE[t])]


def builder_path(name, **hyper_parameters):
    """The weights after each of STEPS updates by the registered builder's direction (a unit lr), and its state."""
    tx = OPTIMIZERS[name](MODEL, **hyper_parameters)
    params, state, path = PARAMS, tx.init(PARAMS), []
    update = jax.jit(tx.update)  # one compilation costs less than the eager dispatch of every small op
    for t in range(STEPS):
        grads = jax.tree.unflatten(TREEDEF, [jnp.asarray(g, jnp.float32) for g in gradient(leaves64(params), t)])
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        path.append(leaves64(params))
    return path, state


def first_updates(*transformations):
    """Each transformation's first update of the tiny GPT's weights (leaves), in one compilation."""
    grads = jax.tree.unflatten(TREEDEF, [jnp.asarray(g, jnp.float32) for g in gradient(leaves64(PARAMS), 0)])
    updates = jax.jit(lambda p, g: [tx.update(g, tx.init(p), p)[0] for tx in transformations])(PARAMS, grads)
    return [leaves64(u) for u in updates]


def formula_path(step):
    """The weights after each of STEPS updates of `step(params, grads, k, state) -> (params, state)`, k = 1, 2, ...
    (leaves as float64 numpy arrays; `state` starts as {})."""
    params, state, path = leaves64(PARAMS), {}, []
    for t in range(STEPS):
        params, state = step(params, gradient(params, t), t + 1, state)
        path.append(params)
    return path, state


def assert_same_path(ours, formula, moved=1e-2):
    for k, (a_step, b_step) in enumerate(zip(ours, formula)):
        for i, (a, b) in enumerate(zip(a_step, b_step)):
            # float32 optimizer against the formula in float64 over several steps (divisions by sqrt(v) + eps
            # amplify rounding in small gradients): 1e-4 relative
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"step {k + 1}, leaf {i}")
    # The comparison means something only if the weights moved well beyond its tolerance.
    assert max(np.abs(a - b).max() for a, b in zip(ours[-1], leaves64(PARAMS))) > moved


def per_leaf(state, key, params):
    return state.setdefault(key, [np.zeros_like(p) for p in params])


def decay(params, weight_decay):
    return [weight_decay * p if d else 0 * p for p, d in zip(params, DECAYED)]


# --- Adam family ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("nesterov", [True, False])
def test_nadamw_is_adam_with_a_nesterov_look_ahead_and_decoupled_decay(nesterov):
    hp = dict(beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.3, nesterov=nesterov)

    def step(params, grads, k, s):
        b1, b2 = hp["beta1"], hp["beta2"]
        m = [b1 * m + (1 - b1) * g for m, g in zip(per_leaf(s, "m", params), grads)]
        v = [b2 * v + (1 - b2) * g * g for v, g in zip(per_leaf(s, "v", params), grads)]
        if nesterov:  # Dozat (2016): b1 x the next step's bias-corrected momentum + (1 - b1) x this gradient's
            m_hat = [b1 * m / (1 - b1 ** (k + 1)) + (1 - b1) * g / (1 - b1**k) for m, g in zip(m, grads)]
        else:
            m_hat = [m / (1 - b1**k) for m in m]
        s.update(m=m, v=v)
        return [
            p - mh / (np.sqrt(v / (1 - b2**k)) + hp["eps"]) - d
            for p, mh, v, d in zip(params, m_hat, v, decay(params, hp["weight_decay"]))
        ], s

    assert_same_path(builder_path("nadamw", **hp)[0], formula_path(step)[0])


def test_adafactor_factors_clips_scales_by_the_weights_and_decays():
    """Shazeer & Stern (2018), Algorithms 4-5 with update clipping (RMS above 0.5 here: every step clips), the
    relative step (x RMS of the weights, at least 1e-3) and a first-moment EMA; every matrix here (two largest dims
    >= 4) is factored, the vectors are not."""
    hp = dict(
        factored=True,
        min_dim_size_to_factor=4,
        decay_rate=0.8,
        decay_offset=0,
        multiply_by_parameter_scale=True,
        clipping_threshold=0.5,
        momentum=0.5,
        eps=1e-30,
        weight_decay=0.2,
    )

    def step(params, grads, k, s):
        rho = 1 - k ** -hp["decay_rate"]
        rows, cols, full, momenta = (s.setdefault(key, {}) for key in ("r", "c", "v", "m"))
        out = []
        for i, (p, g) in enumerate(zip(params, grads)):
            g2 = g * g + hp["eps"]
            d1, d0 = (int(a) for a in np.argsort(p.shape)[-2:]) if p.ndim >= 2 else (None, None)  # the 2 largest
            if d1 is not None and p.shape[d1] >= hp["min_dim_size_to_factor"]:
                r = rows[i] = rho * rows.get(i, 0) + (1 - rho) * g2.mean(axis=d0, keepdims=True)
                c = cols[i] = rho * cols.get(i, 0) + (1 - rho) * g2.mean(axis=d1, keepdims=True)
                v_hat = (r / r.mean(axis=d1, keepdims=True)) * c  # R C^T / (1^T R)
            else:
                v_hat = full[i] = rho * full.get(i, 0) + (1 - rho) * g2
            u = g / np.sqrt(v_hat)
            u = u / max(1.0, np.sqrt(np.mean(u * u)) / hp["clipping_threshold"])
            u = u * max(np.sqrt(np.mean(p * p)), 1e-3)
            m = momenta[i] = hp["momentum"] * momenta.get(i, 0) + (1 - hp["momentum"]) * u
            out.append(p - m - (hp["weight_decay"] * p if DECAYED[i] else 0))
        return out, s

    ours, _ = builder_path("adafactor", **hp)
    formula, state = formula_path(step)
    assert len(state["r"]) == sum(DECAYED) + 1  # all matrices factored (the position embedding too), vectors not
    assert_same_path(ours, formula, moved=1e-3)


def test_ademamix_mixes_a_slow_ema_with_alpha_and_beta3_warmed_up():
    """Pagliardini et al. (2024), Algorithm 1, with the schedulers of their code: alpha linear from 0, beta3 from beta1
    with a linear half-life; T = 2 < 3 steps, so both warm-ups and their plateau are exercised."""
    hp = dict(beta1=0.8, beta2=0.9, beta3=0.99, alpha=4.0, alpha_warmup=2, beta3_warmup=2, eps=1e-6, weight_decay=0.3)
    half_life = lambda beta: np.log(0.5) / np.log(beta)  # noqa: E731

    def step(params, grads, k, s):
        b1, b2, a = hp["beta1"], hp["beta2"], min(k / 2, 1.0)
        alpha = a * hp["alpha"]
        b3 = 0.5 ** (1 / ((1 - a) * half_life(b1) + a * half_life(hp["beta3"])))
        m1 = [b1 * m + (1 - b1) * g for m, g in zip(per_leaf(s, "m1", params), grads)]
        m2 = [b3 * m + (1 - b3) * g for m, g in zip(per_leaf(s, "m2", params), grads)]
        nu = [b2 * v + (1 - b2) * g * g for v, g in zip(per_leaf(s, "nu", params), grads)]
        s.update(m1=m1, m2=m2, nu=nu)
        return [
            p - (m1 / (1 - b1**k) + alpha * m2) / (np.sqrt(nu / (1 - b2**k)) + hp["eps"]) - d
            for p, m1, m2, nu, d in zip(params, m1, m2, nu, decay(params, hp["weight_decay"]))
        ], s

    assert_same_path(builder_path("ademamix", **hp)[0], formula_path(step)[0])


# --- sign and betting ----------------------------------------------------------------------------------------------


def test_signum_steps_by_the_sign_of_an_ema_with_decoupled_decay():
    hp = dict(momentum=0.6, weight_decay=0.3)

    def step(params, grads, k, s):
        m = [hp["momentum"] * m + (1 - hp["momentum"]) * g for m, g in zip(per_leaf(s, "m", params), grads)]
        s.update(m=m)
        return [p - np.sign(m) - d for p, m, d in zip(params, m, decay(params, hp["weight_decay"]))], s

    assert_same_path(builder_path("signum", **hp)[0], formula_path(step)[0])


def test_cocob_bets_on_the_summed_negative_gradients():
    """Orabona & Tommasi (2017), Algorithm 2 (COCOB-Backprop), L_0 = eps, with L2 decay added to the gradient."""
    hp = dict(alpha=10.0, eps=1e-3, weight_decay=0.3)
    w1 = leaves64(PARAMS)

    def step(params, grads, k, s):
        grads = [g + d for g, d in zip(grads, decay(params, hp["weight_decay"]))]
        L = [np.maximum(L, np.abs(g)) for L, g in zip(s.get("L", [np.full_like(p, hp["eps"]) for p in params]), grads)]
        G = [G + np.abs(g) for G, g in zip(per_leaf(s, "G", params), grads)]
        reward = [np.maximum(R - g * (p - p1), 0) for R, g, p, p1 in zip(per_leaf(s, "R", params), grads, params, w1)]
        theta = [th - g for th, g in zip(per_leaf(s, "theta", params), grads)]
        s.update(L=L, G=G, R=reward, theta=theta)
        return [
            p1 + th / (L * np.maximum(G + L, hp["alpha"] * L)) * (L + R)
            for p1, th, L, G, R in zip(w1, theta, L, G, reward)
        ], s

    assert_same_path(builder_path("cocob", **hp)[0], formula_path(step)[0])


# --- learning-rate-free Adam ---------------------------------------------------------------------------------------


def l1(trees):
    return sum(np.abs(x).sum() for x in trees)


def dot(a, b):
    return sum((x * y).sum() for x, y in zip(a, b))


def test_dadapt_adamw_grows_its_step_size_from_the_weighted_gradient_sums():
    """Defazio & Mishchenko (2023), Algorithm 4 (D-Adapted Adam) with Adam's bias correction (optax's form, the
    reference's use_bias_correction=True): s and r are sums over every parameter; d never decreases; the step uses the
    d from before the update. (Without the correction, the preset's default: tests/test_optimizers_research.py.)"""
    hp = dict(beta1=0.8, beta2=0.9, eps=1e-6, d0=0.05, weight_decay=0.3, bias_correction=True)
    b1, b2 = hp["beta1"], hp["beta2"]
    sb2 = np.sqrt(b2)

    def step(params, grads, k, s):
        d = s.get("d", hp["d0"])
        dlr = d * np.sqrt(1 - b2**k) / (1 - b1**k)
        v_old, s_old = per_leaf(s, "v", params), per_leaf(s, "s", params)
        numerator_step = dot(grads, [sk / (np.sqrt(v) + hp["eps"]) for sk, v in zip(s_old, v_old)])
        m = [b1 * m + (1 - b1) * dlr * g for m, g in zip(per_leaf(s, "m", params), grads)]
        v = [b2 * v + (1 - b2) * g * g for v, g in zip(v_old, grads)]
        sums = [sb2 * sk + (1 - sb2) * dlr * g for sk, g in zip(s_old, grads)]
        r = sb2 * s.get("r", 0.0) + (1 - sb2) * dlr * numerator_step
        s.update(m=m, v=v, s=sums, r=r, d=max(d, r / ((1 - sb2) * l1(sums))))
        return [
            p - m / (np.sqrt(v) + hp["eps"]) - dlr * dp
            for p, m, v, dp in zip(params, m, v, decay(params, hp["weight_decay"]))
        ], s

    ours, state = builder_path("dadapt_adamw", **hp)
    formula, expected = formula_path(step)
    assert expected["d"] > hp["d0"]  # the estimate grew: the test covers it
    np.testing.assert_allclose(float(state.d), expected["d"], rtol=1e-4)  # float32 sums against float64
    assert_same_path(ours, formula)


def test_prodigy_estimates_d_from_the_distance_travelled():
    """Mishchenko & Defazio (2023), Algorithm 4 (Prodigy, Adam version), beta3 = sqrt(beta2) by default, without
    safeguard warmup, with Adam's bias correction folded into the step (optax's form, the reference code's with
    use_bias_correction=True; without it, the preset's default: tests/test_optimizers_research.py)."""
    hp = dict(
        beta1=0.8,
        beta2=0.9,
        eps=1e-6,
        d0=0.05,
        d_coef=1.5,
        safeguard_warmup=False,
        weight_decay=0.3,
        bias_correction=True,
    )
    b1, b2, d0 = hp["beta1"], hp["beta2"], hp["d0"]
    b3 = np.sqrt(b2)
    w0 = leaves64(PARAMS)

    def step(params, grads, k, s):
        d = s.get("d", d0)
        dlr = d * np.sqrt(1 - b2**k) / (1 - b1**k)
        numerator_step = dot(grads, [p0 - p for p0, p in zip(w0, params)])
        m = [b1 * m + (1 - b1) * d * g for m, g in zip(per_leaf(s, "m", params), grads)]
        v = [b2 * v + (1 - b2) * d * d * g * g for v, g in zip(per_leaf(s, "v", params), grads)]
        sums = [b3 * sk + d / d0 * dlr * g for sk, g in zip(per_leaf(s, "s", params), grads)]
        r = b3 * s.get("r", 0.0) + d / d0 * dlr * numerator_step
        s.update(m=m, v=v, s=sums, r=r, d=max(d, hp["d_coef"] * r / l1(sums)))
        return [
            p - dlr * m / (np.sqrt(v) + s["d"] * hp["eps"]) - dlr * dp  # eps x the new d, as the reference
            for p, m, v, dp in zip(params, m, v, decay(params, hp["weight_decay"]))
        ], s

    ours, state = builder_path("prodigy", **hp)
    formula, expected = formula_path(step)
    assert expected["d"] > d0
    np.testing.assert_allclose(float(state.d), expected["d"], rtol=1e-4)  # float32 sums against float64
    assert_same_path(ours, formula)


# --- schedule-free -------------------------------------------------------------------------------------------------


def schedule_free_step(z_step, sf_lr, warmup, b1, weight_lr_power):
    """Defazio et al. (2024), Algorithm 1: the weights are y; z_{k+1} = z_k - lr_k x z_step(g at y); x is z's average
    with weights max lr^power; y = (1 - b1) z + b1 x. lr_k = sf_lr x min(1, k / warmup), as the reference code."""

    def step(params, grads, k, s):
        lr = sf_lr * min(1.0, k / warmup)
        s["lr_max"] = max(s.get("lr_max", 0.0), lr)
        weight = s["lr_max"] ** weight_lr_power
        s["weight_sum"] = s.get("weight_sum", 0.0) + weight
        c = weight / s["weight_sum"]
        z = [z - lr * u for z, u in zip(s.get("z", leaves64(PARAMS)), z_step(params, grads, k, s))]
        x = [(1 - c) * x + c * z for x, z in zip(s.get("x", leaves64(PARAMS)), z)]
        s.update(z=z, x=x)
        return [(1 - b1) * z + b1 * x for z, x in zip(z, x)], s

    return step


def test_schedule_free_adamw_averages_adam_steps_and_evaluates_at_x():
    """Also: the warmup's first step moves z (optax's own schedule_free_adamw would not), and
    schedule_free_eval_params on the state found by name gives the formula's x."""
    hp = dict(sf_lr=0.5, sf_warmup=2, beta1=0.7, beta2=0.9, eps=1e-6, weight_decay=0.3, weight_lr_power=2.0)

    def adam_step(params, grads, k, s):
        v = [hp["beta2"] * v + (1 - hp["beta2"]) * g * g for v, g in zip(per_leaf(s, "v", params), grads)]
        s["v"] = v
        return [
            g / (np.sqrt(v / (1 - hp["beta2"] ** k)) + hp["eps"]) + d
            for g, v, d in zip(grads, v, decay(params, hp["weight_decay"]))
        ]

    ours, state = builder_path("schedule_free_adamw", **hp)
    formula, expected = formula_path(
        schedule_free_step(adam_step, hp["sf_lr"], hp["sf_warmup"], hp["beta1"], hp["weight_lr_power"])
    )
    assert_same_path(ours, formula)
    y = jax.tree.unflatten(TREEDEF, [jnp.asarray(p, jnp.float32) for p in ours[-1]])
    x = jax.jit(optax.contrib.schedule_free_eval_params)(optax.tree.get(state, "ScheduleFreeState"), y)
    for a, b in zip(leaves64(x), expected["x"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_schedule_free_sgd_averages_sgd_steps():
    hp = dict(sf_lr=0.5, sf_warmup=2, momentum=0.7, weight_decay=0.3, weight_lr_power=2.0)

    def sgd_step(params, grads, k, s):
        return [g + d for g, d in zip(grads, decay(params, hp["weight_decay"]))]

    formula, _ = formula_path(
        schedule_free_step(sgd_step, hp["sf_lr"], hp["sf_warmup"], hp["momentum"], hp["weight_lr_power"])
    )
    assert_same_path(builder_path("schedule_free_sgd", **hp)[0], formula)


def test_schedule_free_without_warmup_is_optax_own():
    hp = dict(sf_lr=0.5, sf_warmup=0, beta1=0.7, beta2=0.9, eps=1e-6, weight_decay=0.0, weight_lr_power=2.0)
    ours, _ = builder_path("schedule_free_adamw", **hp)
    theirs = optax.contrib.schedule_free_adamw(0.5, None, b1=0.7, b2=0.9, eps=1e-6, weight_decay=0.0)
    params, state, update = PARAMS, theirs.init(PARAMS), jax.jit(theirs.update)
    for t in range(STEPS):
        grads = jax.tree.unflatten(TREEDEF, [jnp.asarray(g, jnp.float32) for g in gradient(leaves64(params), t)])
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
    for a, b in zip(ours[-1], leaves64(params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_schedule_free_state_is_found_by_name_inside_the_pipeline():
    """Evaluation's recipe works on the pipeline's whole optimizer state (clipping, lr, MultiSteps around it)."""
    cfg = load_config(
        [
            "optimizer=schedule_free_sgd",
            "optimizer/lr_config=constant",
            "optimizer.lr_config.lr=1",
            "optimizer.lr_config.warmup=0",
        ]
    )
    tx = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 10), MODEL, 2)
    x = jax.jit(lambda p: optax.contrib.schedule_free_eval_params(optax.tree.get(tx.init(p), "ScheduleFreeState"), p))(
        PARAMS
    )
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(PARAMS)):  # before any step, x = y = z
        np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("name,key", [("schedule_free_adamw", "beta1"), ("schedule_free_sgd", "momentum")])
def test_schedule_free_refuses_a_zero_interpolation(name, key):
    cfg = load_config([f"optimizer={name}", f"optimizer.{key}=0"])
    with pytest.raises(ConfigError, match=f"optimizer.{key}: {name} needs it > 0"):
        build_direction(cfg.optimizer, MODEL)


# --- every new optimizer -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW)
def test_weight_decay_changes_the_matrices_only(name):
    """One step with the preset's values and weight_decay 0.5 against 0: only the masked leaves (matrices) differ."""
    preset = hyper_parameter_values(load_config([f"optimizer={name}"]).optimizer)
    with_decay, without = first_updates(
        *(OPTIMIZERS[name](MODEL, **{**preset, "weight_decay": weight_decay}) for weight_decay in (0.5, 0.0))
    )
    for i, (a, b) in enumerate(zip(with_decay, without)):
        assert bool(np.any(a != b)) == DECAYED[i], (name, i)


@pytest.mark.parametrize("name", NEW)
def test_every_preset_composes_and_builds(name):
    cfg = load_config([f"optimizer={name}"], num_local_devices=1)
    assert cfg.optimizer.name == name
    [updates] = first_updates(build_direction(cfg.optimizer, MODEL))
    assert all(np.isfinite(u).all() for u in updates) and any(np.any(u != 0) for u in updates)


def test_sophia_steps_as_its_authors_code_with_hutchinsons_estimate_of_the_hessian_diagonal():
    """Liu et al. (2023), Algorithm 3 with the estimator of Sophia-H, in the order of the authors' code and optax's:
    each step divides the momentum by gamma x the EMA of the Hessian's diagonal as it stood (0 until the first
    refresh: every coordinate clipped), clips to [-1, 1], decays the matrices, and then, every `update_interval`
    steps from the first, moves the EMA toward u * (H u). optax bias-corrects the momentum (the authors' code does
    not). On a separable quadratic H is diagonal, and with Rademacher u (u^2 = 1) the estimate is H's diagonal exactly,
    so the path is deterministic; the gradients carry noise (a mini-batch's), 25 steps refresh the EMA three times,
    and some coordinates clip while others do not."""
    hp = dict(beta1=0.9, beta2=0.5, eps=1e-12, weight_decay=0.1, gamma=0.25, clip_threshold=1.0, update_interval=10)
    steps = 25
    rng = np.random.default_rng(1)
    h = [rng.uniform(0.5, 2.0, size=t.shape) for t in TARGET]
    noise = [[rng.normal(size=t.shape) for t in TARGET] for _ in range(steps)]

    def objective(params):
        return sum(0.5 * jnp.sum(c * (p - t) ** 2) for p, c, t in zip(jax.tree.leaves(params), h, TARGET))

    tx = OPTIMIZERS["sophia"](MODEL, **hp)
    update = jax.jit(lambda g, s, p: tx.update(g, s, p, obj_fn=objective))
    gradient = jax.jit(jax.grad(objective))
    params, state, ours = PARAMS, tx.init(PARAMS), []
    for k in range(steps):
        grads = jax.tree.map(
            lambda g, n: g + jnp.asarray(n, g.dtype), gradient(params), jax.tree.unflatten(TREEDEF, noise[k])
        )
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        ours.append(leaves64(params))

    w, m, ema, clipped = leaves64(PARAMS), [0.0] * len(h), [0.0] * len(h), []
    for k in range(1, steps + 1):
        g = [c * (p - t) + n for p, c, t, n in zip(w, h, TARGET, noise[k - 1])]
        m = [hp["beta1"] * mi + (1 - hp["beta1"]) * gi for mi, gi in zip(m, g)]
        ratio = [mi / (1 - hp["beta1"] ** k) / np.maximum(hp["gamma"] * e, hp["eps"]) for mi, e in zip(m, ema)]
        clipped.append(np.mean(np.concatenate([np.abs(r).ravel() >= 1 for r in ratio])))
        w_next = [p - np.clip(r, -1, 1) - d for p, r, d in zip(w, ratio, decay(w, hp["weight_decay"]))]
        if (k - 1) % hp["update_interval"] == 0:
            ema = [hp["beta2"] * e + (1 - hp["beta2"]) * c for e, c in zip(ema, h)]
        w = w_next
        for i, (a, b) in enumerate(zip(ours[k - 1], w)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"step {k}, leaf {i}")
    assert clipped[0] == 1.0 and 0.05 < clipped[-1] < 0.95, clipped
