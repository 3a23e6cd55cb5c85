"""optimizer.groups: labelled parameters get their own optimizer, lr multiplier or hyper-parameters; Muon is one use."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from core.errors import ConfigError
from helpers import build, read_metrics, run_in_process, tiny_overrides
from models.config import GPTConfig
from models.gpt import GPT
from optimizers import build_optimizer, build_schedule
from optimizers.decay import fixed
from optimizers.groups import matrix_optimizers
from optimizers.registry import OWN_WIDTH_RULE
from training.config import load_config

MODEL = GPT.init(GPTConfig(vocab_size=259, n_layer=2, n_head=2, n_embd=32, context_size=32), jax.random.PRNGKey(0))
PARAMS = eqx.filter(MODEL, eqx.is_array)


# Two differently composed optax chains (or a chain and the rule in numpy) after 3-4 steps, roundings apart: float32
# params <= ~0.1 (init 0.02, steps of <= lr 0.01) off by a few 2^-24 x 0.1 ~ 1e-8 (atol 1e-7), and O(1) LayerNorm
# weights by a few ulp ~ 1e-7 (rtol 1e-5): CHAIN_TOLERANCE leaves >= 10x
CHAIN_TOLERANCE = dict(rtol=1e-5, atol=1e-7)


def follow(optimizer, steps=4):
    """Parameters after `steps` updates with the same random gradients whatever the optimizer."""
    params, state = PARAMS, optimizer.init(PARAMS)
    for i in range(steps):
        grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(i), x.shape), params)
        updates, state = optimizer.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


def ours(*overrides):
    cfg = load_config(
        [
            "optimizer.grad_clip=0",
            "optimizer/lr_config=constant",
            "optimizer.lr_config.lr=0.01",
            "optimizer.lr_config.warmup=0",
            *overrides,
        ]
    )
    return build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 10), MODEL, 1)


def subtree(params, labels):
    """The parameters whose label is one of `labels`, the others None."""
    return jax.tree.map(lambda p, label: p if label in labels else None, params, MODEL.parameter_labels())


def test_each_group_gets_exactly_optax_own_update_with_its_overrides():
    got = follow(
        ours(
            "optimizer=adamw",
            "optimizer.weight_decay=0.1",
            "optimizer.groups={matrix: {name: lion, beta1: 0.8}, vector: {weight_decay: 0.5, lr_multiplier: 0.5}}",
        )
    )
    decay = fixed(MODEL.weight_decay_mask())
    by_hand = {  # each group run alone through optax, as its overrides say
        ("attn_qkv", "attn_out", "mlp_in", "mlp_out"): optax.lion(0.01, b1=0.8, b2=0.95, weight_decay=0.1, mask=decay),
        ("norm", "bias"): optax.adamw(0.005, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.5),  # decays all its members
        ("token_embedding", "position"): optax.adamw(0.01, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=decay),
    }
    for labels, optimizer in by_hand.items():
        params, state = subtree(PARAMS, labels), None
        state = optimizer.init(params)
        for i in range(4):
            grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(i), x.shape), subtree(PARAMS, labels))
            updates, state = optimizer.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        for a, b in zip(jax.tree.leaves(subtree(got, labels)), jax.tree.leaves(params)):
            np.testing.assert_allclose(a, b, **CHAIN_TOLERANCE)
    moved = subtree(jax.tree.map(lambda a, b: bool(jnp.any(a != b)), got, PARAMS), ("norm", "bias"))
    assert all(jax.tree.leaves(moved))  # the group's weight decay reached LayerNorm and the biases


def test_muon_through_groups_equals_the_muon_it_replaces_to_the_last_bit():
    """conf/optimizer/muon.yaml against Muon as it was written before groups: optax's Muon on the blocks' matrices
    and AdamW at adam_lr_ratio x the lr (the preset's group multiplier) on everything else, in one optax.partition."""
    o = load_config(["optimizer=muon"]).optimizer
    ratio = o.groups["adam"]["lr_multiplier"]
    matrices = MODEL.block_matrices_mask()
    dims = jax.tree.map(lambda w: optax.contrib.MuonDimensionNumbers(1, tuple(range(2, w.ndim))), PARAMS)
    decay_mask = jax.tree.map(lambda d, m: d and not m, MODEL.weight_decay_mask(), matrices)
    before = optax.chain(
        optax.partition(
            {
                "muon": optax.contrib.muon(
                    1.0,
                    beta=o.momentum,
                    nesterov=o.nesterov,
                    weight_decay=o.weight_decay,
                    muon_weight_dimension_numbers=lambda p: dims,
                ),
                "adamw": optax.adamw(
                    ratio, o.beta1, o.beta2, o.eps, weight_decay=o.weight_decay, mask=fixed(decay_mask)
                ),
            },
            fixed(jax.tree.map(lambda m: "muon" if m else "adamw", matrices)),
        ),
        optax.scale(0.01),
    )
    got, want = follow(ours("optimizer=muon")), follow(before)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        # exact on any CPU: run eagerly, each op is its own program, and both run the same ops in the same order
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(got.blocks.fc.weight, PARAMS.blocks.fc.weight)


def test_a_groups_own_warmup_below_1_is_a_fraction_of_the_run():
    """A group's momentum_warmup of 0.5 in a run of 12 optimizer steps is 6 steps, as it is in the section: the same
    updates as a group given 6, and not those of the 0.5 read as steps (full momentum from the second step: what a
    build that does not know the run's length makes of it)."""

    def grouped(warmup, run_steps=12):
        group = f"{{matrix: {{name: muon, momentum_warmup: {warmup}, momentum_start: 0.5}}}}"
        cfg = load_config(["optimizer.grad_clip=0", "optimizer/lr_config=constant", f"+optimizer.groups={group}"])
        schedule = build_schedule(cfg.optimizer.lr_config, 12)
        optimizer = build_optimizer(cfg.optimizer, schedule, MODEL, 1, run_steps=run_steps)
        params, state = PARAMS, optimizer.init(PARAMS)
        update = jax.jit(optimizer.update)
        for i in range(3):  # follow's gradients, one program per build
            grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(i), x.shape), params)
            updates, state = update(grads, state, params)
            params = optax.apply_updates(params, updates)
        return params

    fraction = grouped(0.5)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **CHAIN_TOLERANCE), fraction, grouped(6))
    as_steps = grouped(0.5, run_steps=None)
    assert not all(jax.tree.leaves(jax.tree.map(lambda x, y: np.allclose(x, y, **CHAIN_TOLERANCE), fraction, as_steps)))


def test_each_groups_lr_is_logged_as_what_it_applied(data_cache):
    parts = build(
        tiny_overrides(
            data_cache,
            "optimizer=sgdm",
            "optimizer.momentum=0",
            "optimizer.weight_decay=0",
            "optimizer.grad_clip=0",
            "optimizer.groups={vector: {lr_multiplier: 0.25}}",
        )
    )
    assert not jnp.any(parts.state.model.ln_f.bias)  # starts at 0: its change after a step is exact
    grad = jax.jit(jax.grad(lambda b: _loss(parts, b)))(parts.state.model.ln_f.bias)
    metrics = parts.step(0)
    # x 0.25 (a power of 2) is exact in float32 and float64 alike: rel 1e-7, under an ulp (1.2e-7), is equality
    assert float(metrics["lr/vector"]) == pytest.approx(0.25 * float(metrics["lr"]), rel=1e-7)
    lr = float(metrics["lr/vector"])
    # the compiled step's gradient against a jax.grad of the loss alone (two programs): an entry sums 512 tokens' terms
    # in another order, off by ~1e-6 of the largest entries rather than of its own size: atol 1e-5 x lr x max|g|
    np.testing.assert_allclose(
        parts.state.model.ln_f.bias, -lr * np.asarray(grad), rtol=1e-5, atol=1e-5 * lr * float(np.abs(grad).max())
    )


def _loss(parts, ln_f_bias):
    """The step's loss as a function of the final LayerNorm's bias (the first batch, float32)."""
    from training.step.losses import mean_loss

    batch = jax.tree.map(lambda x: jnp.asarray(x[0]), parts.data.train.batch(0))
    model = eqx.tree_at(lambda m: m.ln_f.bias, parts.state.model, ln_f_bias)
    return mean_loss(model, batch, None, jnp.float32)


SCION = "scale_hidden: 50.0, scale_embed: 3000.0, scale_input: 16.7, scale_vector: 50.0, unconstrained: true"


def test_a_group_of_an_optimizer_without_decay_takes_the_sections_decay_by_mode_or_says_none():
    """Native mode and no decay of its own: the group says weight_decay 0; decoupled: the section's decay reaches it."""
    none = load_config([f"optimizer.groups={{matrix: {{name: scion, weight_decay: 0, {SCION}}}}}"])
    assert none.optimizer.groups["matrix"]["weight_decay"] == 0
    load_config(["optimizer.weight_decay_mode=decoupled", f"optimizer.groups={{matrix: {{name: scion, {SCION}}}}}"])


@pytest.mark.parametrize(
    "groups, message",
    [
        ("{attention: {lr_multiplier: 2}}", "optimizer.groups.attention: 'attention' is no parameter label"),
        (
            "{matrix: {lr_multiplier: 2}, mlp: {labels: [mlp_in]}}",
            "optimizer.groups.mlp: mlp_in is also in group matrix",
        ),
        ("{vector: {momentum: 0.5}}", "optimizer.groups.vector.momentum: adamw has no such key"),
        ("{vector: {grad_clip: 0.5}}", "optimizer.groups.vector.grad_clip: adamw has no such key"),
        ("{vector: {name: nope}}", "optimizer.groups.vector.name: must be one of"),
        ("{vector: {lr_multiplier: -1}}", "optimizer.groups.vector.lr_multiplier: must be a number >= 0"),
        # the section's own checks, on a group's values: a type optax would fail on mid-run, a range it would take
        ("{matrix: {beta1: abc}}", "optimizer.groups.matrix.beta1: must be a float, as optimizer.beta1; got 'abc'"),
        ("{matrix: {beta1: 1.5}}", "optimizer.groups.matrix.beta1: must be in [0, 1"),
        ("{vector: {weight_decay: -0.1}}", "optimizer.groups.vector.weight_decay: must be >= 0; got -0.1"),
        # an optimizer's own key, null in the section: typed by its builder (a string reached Muon's comparison)
        ("{matrix: {name: muon, ns_steps: abc}}", "optimizer.groups.matrix.ns_steps: must be an int, as optimizer"),
        ("{matrix: {labels: 5}}", "optimizer.groups.matrix.labels: must be a label or a list of labels"),
        # the section's decay (adamw's 0.1) on an optimizer with none of its own: dropped for the group without a word
        (f"{{matrix: {{name: scion, {SCION}}}}}", "optimizer.groups.matrix.name: scion has no decay of its own"),
    ],
)
def test_a_bad_group_is_one_config_error(groups, message):
    with pytest.raises(ConfigError, match="^config: " + message.replace("[", r"\[")):
        load_config([f"optimizer.groups={groups}"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        # decay scaled by the run's lr, where that lr is not the step size: 10% of each weight gone per step
        (
            ["optimizer=prodigy", "optimizer.weight_decay_mode=decoupled", "optimizer.weight_decay=0.1"],
            "weight_decay_mode: decoupled",
        ),
        (
            ["optimizer=cocob", "optimizer.weight_decay_mode=decoupled", "optimizer.weight_decay=0.1"],
            "weight_decay_mode: decoupled",
        ),
        # groups: a schedule-free state split by group (its evaluation weights fail), or a group at lr 1
        (
            ["optimizer=schedule_free_adamw", "+optimizer.groups={vector: {weight_decay: 0.0}}"],
            "groups: schedule_free_adamw",
        ),
        (["optimizer=dadapt_adamw", "+optimizer.groups={embedding: {name: adamw}}"], "groups: dadapt_adamw estimates"),
        (["+optimizer.groups={embedding: {name: prodigy}}"], "groups.embedding.name: prodigy sets its own step size"),
        # a schedule-free step changed after the method: its averaged weights no longer are the average
        (["optimizer=schedule_free_sgd", "optimizer.cautious=true"], "cautious: it changes schedule_free_sgd's steps"),
        (["optimizer=schedule_free_adamw", "optimizer.mechanic=true"], "mechanic: it changes schedule_free_adamw's"),
        (["optimizer=schedule_free_adamw", "model.parametrization=mup"], "model.parametrization: μP scales"),
        # an lr sweep that would run the same run at every point: the step size is the method's own key
        (["optimizer=schedule_free_adamw", "optimizer.lr_config.lr=0.01"], "lr_config.lr: schedule_free_adamw sets"),
        (
            ["optimizer=cocob", "optimizer/lr_config=cosine"],
            "lr_config: cocob sets its own step size (optimizer.alpha)",
        ),
    ],
)
def test_what_would_move_a_step_outside_a_method_with_its_own_step_size_is_refused(overrides, message):
    with pytest.raises(ConfigError, match="^config: [a-z_.]*" + message.split(": ", 1)[0].split(".")[-1]) as e:
        load_config(overrides)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "overrides, message",
    [  # each trained without a word: d never grew, the Hessian was estimated once, ...
        (["optimizer=prodigy", "optimizer.d0=0"], "optimizer.d0: prodigy needs it > 0; got 0"),
        (["optimizer=dadapt_adamw", "optimizer.d0=0"], "optimizer.d0: dadapt_adamw needs it > 0; got 0"),
        (["optimizer=sophia", "optimizer.update_interval=0"], "optimizer.update_interval: sophia needs it >= 1; got 0"),
        (["optimizer=cocob", "optimizer.alpha=0"], "optimizer.alpha: cocob needs it > 0; got 0"),
        # a negative size turned Muon's matrices up the loss; Adafactor's second moment went NaN at its second step
        (["optimizer=muon", "optimizer.consistent_rms=-0.2"], "optimizer.consistent_rms: muon needs it > 0"),
        (["optimizer=adafactor", "optimizer.decay_rate=-1"], "optimizer.decay_rate: adafactor needs it > 0"),
        (["optimizer=adafactor", "optimizer.clipping_threshold=-1"], "optimizer.clipping_threshold: adafactor needs"),
        (["optimizer=adafactor", "optimizer.min_dim_size_to_factor=0"], "optimizer.min_dim_size_to_factor: adafactor"),
        # a key the schema shares, set for an optimizer that does not read it: refused as another's own key is
        (
            ["optimizer=adamw", "optimizer.nesterov=true"],
            "optimizer.nesterov: adamw does not read it (muon, nadamw, sgdm",
        ),
        (["optimizer=sgdm", "optimizer.beta2=0.5"], "optimizer.beta2: sgdm does not read it"),
        (["optimizer=ademamix", "optimizer.beta3=1.0"], "optimizer.beta3: ademamix needs it in [0, 1); got 1.0"),
        (["optimizer=schedule_free_sgd", "optimizer.sf_lr=-1"], "optimizer.sf_lr: schedule_free_sgd needs it > 0"),
        (["optimizer=schedule_free_adamw", "optimizer.sf_warmup=-1"], "optimizer.sf_warmup: schedule_free_adamw needs"),
        (
            ["+optimizer.groups={matrix: {name: sophia, update_interval: 0}}"],
            "optimizer.groups.matrix.update_interval: sophia",
        ),
    ],
)
def test_an_optimizers_own_key_out_of_its_range_is_one_config_line(overrides, message):
    with pytest.raises(ConfigError, match="^config: " + re.escape(message)):
        load_config(overrides)


def test_what_a_method_with_its_own_step_size_keeps():
    """Its own decay, L2, and (COCOB, which evaluates its parameters) the wrappers stay valid."""
    for overrides in (
        ["optimizer=prodigy", "optimizer.weight_decay=0.1"],
        ["optimizer=schedule_free_adamw", "optimizer.weight_decay_mode=l2"],
        ["optimizer=cocob", "optimizer.mechanic=true"],
    ):
        assert load_config(overrides).optimizer.name == overrides[0].split("=")[1]


def test_a_label_the_model_lacks_exits_2_with_one_line(data_cache, tmp_path, capsys):
    result = run_in_process(
        tiny_overrides(data_cache, f"logging.run_dir={tmp_path}/run", "optimizer.groups={head: {lr_multiplier: 0.5}}"),
        capsys,
    )
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(err) == 1, result.stderr
    assert err[0].startswith(
        "error: config: optimizer.groups.head: the model has no parameter labelled head "
        "(its labels: token_embedding, position, attn_qkv"
    ), err


def test_what_an_optimizer_measures_reaches_the_log(data_cache, tmp_path, capsys):
    """Muon keeps its update's RMS in its state (optimizers/reporting.py); the loop logs it with the loss."""
    run_dir = tmp_path / "run"
    result = run_in_process(
        tiny_overrides(
            data_cache,
            f"logging.run_dir={run_dir}",
            "optimizer=muon",
            "train.max_steps=3",
            "train.eval_interval=100",
            "checkpoint.save=false",
            "logging.tensorboard=false",
        ),
        capsys,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = read_metrics(run_dir, "train")
    assert [r["step"] for r in rows] == [1, 2, 3]
    rms = [r["optimizer/muon_update_rms"] for r in rows]
    assert all(0 < v < 10 for v in rms) and len(set(rms)) == 3, rms
    # float32 ratio x lr in the step against float64 here: within an ulp or two (~1e-7); approx's default rel 1e-6
    ratio = load_config(["optimizer=muon"]).optimizer.groups["adam"]["lr_multiplier"]
    assert all(r["lr/adam"] == pytest.approx(ratio * r["lr"]) for r in rows)
    assert "| muon_update_rms " in result.stdout + result.stderr  # and on the console line


def test_weight_decay_mode_turns_adam_into_adamw_and_back():
    """decoupled: -wd x w beside the direction (Adam becomes AdamW); l2: wd x w in the gradient (AdamW becomes Adam)."""
    mask = fixed(MODEL.weight_decay_mask())
    adam_decoupled = follow(
        ours(
            "optimizer=adam",
            "optimizer.beta2=0.95",
            "optimizer.weight_decay=0.5",
            "optimizer.weight_decay_mode=decoupled",
        )
    )
    adamw = follow(optax.adamw(0.01, 0.9, 0.95, 1e-8, weight_decay=0.5, mask=mask))
    adamw_l2 = follow(ours("optimizer=adamw", "optimizer.weight_decay=0.5", "optimizer.weight_decay_mode=l2"))
    adam = follow(optax.chain(optax.add_decayed_weights(0.5, mask), optax.adam(0.01, 0.9, 0.95, 1e-8)))
    for got, want in ((adam_decoupled, adamw), (adamw_l2, adam)):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, **CHAIN_TOLERANCE)
    assert not np.allclose(adamw.wte, adam.wte, atol=1e-6)  # the two modes really differ


def test_cautious_keeps_the_downhill_entries_of_the_direction_rescaled():
    got = follow(ours("optimizer=adamw", "optimizer.weight_decay=0", "optimizer.cautious=true"), steps=3)
    params, state, adam = PARAMS, None, optax.adam(1.0, 0.9, 0.95, 1e-8)
    state = adam.init(params)
    for i in range(3):  # the rule written out: the entries of Adam's step that descend, scaled by size / (kept + 1)
        grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(i), x.shape), params)
        direction, state = adam.update(grads, state, params)
        kept = jax.tree.map(lambda u, g: np.asarray(u) * np.asarray(g) < 0, direction, grads)
        step = jax.tree.map(lambda u, k: 0.01 * np.asarray(u) * k * (k.size / (k.sum() + 1)), direction, kept)
        params = jax.tree.map(lambda p, s: p + s, params, step)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params)):
        np.testing.assert_allclose(a, b, **CHAIN_TOLERANCE)  # the rule written out in numpy: other roundings again


def test_cautious_leaves_the_decoupled_decay_unmasked_as_the_paper():
    """On a zero gradient no entry of the direction descends, so cautious keeps none of it: AdamW's own decay, part of
    its direction, goes with it, and weight_decay_mode=decoupled's decay stays, lr x wd x w on the decayed matrices."""
    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    for mode, factor in (("native", 0.0), ("decoupled", -0.01 * 0.5)):
        optimizer = ours("optimizer.weight_decay=0.5", "optimizer.cautious=true", f"optimizer.weight_decay_mode={mode}")
        updates, _ = optimizer.update(zeros, optimizer.init(PARAMS), PARAMS)
        np.testing.assert_allclose(updates.blocks.fc.weight, factor * PARAMS.blocks.fc.weight, rtol=1e-6)
        assert not np.any(updates.ln_f.weight)


def test_mechanic_wraps_the_optimizer_and_reports_its_scale():
    from optimizers.reporting import optimizer_metrics

    optimizer = ours("optimizer=adamw", "optimizer.mechanic=true")
    by_hand = optax.contrib.mechanize(
        optax.chain(
            optax.adamw(1.0, 0.9, 0.95, 1e-8, weight_decay=0.1, mask=fixed(MODEL.weight_decay_mask())),
            optax.scale(0.01),
        )
    )
    for a, b in zip(jax.tree.leaves(follow(optimizer)), jax.tree.leaves(follow(by_hand))):
        # as CHAIN_TOLERANCE, but Mechanic's scale starts small: 4 steps move a weight by < 4e-8, so atol stays 1e-8
        # (~5 ulp of a 0.02 weight) or no step at all would pass
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)
    state = optimizer.init(PARAMS)
    for i in range(2):
        grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(i), x.shape), PARAMS)
        _, state = optimizer.update(grads, state, PARAMS)
    assert float(optimizer_metrics(state)["optimizer/mechanic_scale"]) > 0
    # what the wrapped optimizer measures of itself is read too: the reading stopped at Mechanic's state
    for preset, own in (("muon", "muon_update_rms"), ("prodigy", "prodigy_d")):
        optimizer = ours(f"optimizer={preset}", "optimizer.mechanic=true")
        assert sorted(optimizer_metrics(optimizer.init(PARAMS))) == sorted(
            ["optimizer/mechanic_scale", f"optimizer/{own}"]
        )


def test_schedule_free_evaluates_and_exports_its_averaged_weights(data_cache, tmp_path, capsys):
    """The logged validation loss is the loss of x (schedule-free's average), not of the weights y the train state
    holds; the checkpoint's export weights (what sampling and export_hf read) are x too."""
    from optimizers import eval_params
    from training.checkpoints.checkpointer import Checkpointer
    from training.checkpoints.trained import load_trained
    from training.evaluation.splits import evaluate
    from training.step.state import eval_model

    run_dir = tmp_path / "run"
    args = tiny_overrides(
        data_cache,
        f"logging.run_dir={run_dir}",
        "optimizer=schedule_free_adamw",
        "optimizer.lr_config.warmup=0",  # the run schedule's warm-up does not reach it: refused
        "optimizer.sf_lr=1e-2",
        "optimizer.sf_warmup=0",
        "train.max_steps=6",
        "train.eval_interval=6",
        "logging.tensorboard=false",
    )
    result = run_in_process(args, capsys)
    assert result.returncode == 0, result.stderr[-2000:]
    logged = {r["step"]: r["loss"] for r in read_metrics(run_dir, "val")}[6]
    parts = build(args)
    state = Checkpointer(run_dir / "checkpoints", read_only=True).restore(6, parts.state)
    x, y = eval_model(state), state.model
    assert x is not y
    loss_x, loss_y = (
        evaluate(parts.eval_step, m, parts.data.evals, parts.mesh, parts.data.token_bytes)["val"]["loss"]
        for m in (x, y)
    )
    # the run's evaluation of x and this one: the same eval step on the same restored weights; rel 1e-6 is a few ulp
    assert logged == pytest.approx(loss_x, rel=1e-6) and abs(loss_x - loss_y) > 1e-4, (logged, loss_x, loss_y)
    exported = load_trained(str(run_dir)).model
    for a, b in zip(
        jax.tree.leaves(eqx.filter(exported, eqx.is_array)),
        jax.tree.leaves(eval_params(state.opt_state, eqx.filter(state.model, eqx.is_array))),
    ):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("debias, precondition", [(False, True), (True, False), (False, False)])
def test_adams_ablations_follow_their_formula(debias, precondition):
    """AdamW with the bias correction and/or the second moment switched off, against the rule written out."""
    got = follow(
        ours(
            "optimizer=adamw",
            "optimizer.weight_decay=0",
            f"optimizer.debias={debias}",
            f"optimizer.precondition={precondition}",
        ),
        steps=3,
    )
    b1, b2, eps = 0.9, 0.95, 1e-8
    params = jax.tree.map(np.asarray, PARAMS)
    m = jax.tree.map(np.zeros_like, params)
    v = jax.tree.map(np.zeros_like, params)
    for t in range(1, 4):
        g = jax.tree.map(lambda x: np.asarray(jax.random.normal(jax.random.PRNGKey(t - 1), x.shape)), params)
        m = jax.tree.map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
        v = jax.tree.map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
        c1, c2 = (1 - b1**t, 1 - b2**t) if debias else (1.0, 1.0)
        step = jax.tree.map(lambda m_, v_: (m_ / c1) / (np.sqrt(v_ / c2) + eps) if precondition else m_ / c1, m, v)
        params = jax.tree.map(lambda p, s: p - 0.01 * s, params, step)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params)):
        np.testing.assert_allclose(a, b, **CHAIN_TOLERANCE)  # the rule written out in numpy: other roundings again


def test_muons_own_adam_branch_decays_only_what_the_model_decays():
    """Without the preset's adam group, the parameters Muon does not orthogonalise go to optax's Adam branch: on a zero
    gradient the token embedding decays by lr x wd (AdamW's), and the positions and norms, which the model never
    decays, stay where they are."""
    optimizer = ours("optimizer=muon", "~optimizer.groups.adam", "optimizer.weight_decay=0.1")
    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    updates, _ = optimizer.update(zeros, optimizer.init(PARAMS), PARAMS)
    np.testing.assert_allclose(updates.wte, -0.01 * 0.1 * PARAMS.wte, rtol=1e-6)
    assert not np.any(updates.wpe) and not np.any(updates.ln_f.weight) and not np.any(updates.blocks.ln1.weight)


def test_muon_can_orthogonalise_the_embeddings():
    """With orthogonalize_embeddings, Muon's step for the token embedding is an orthogonalised matrix (its singular
    values all near one scale) instead of Adam's elementwise step."""

    def first_update(*overrides):
        optimizer = ours("optimizer=muon", "optimizer.weight_decay=0", *overrides)
        grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(0), x.shape), PARAMS)
        u, v = jax.random.normal(jax.random.PRNGKey(1), (2, 320))[:, :, None]  # a nearly rank-1 embedding gradient
        grads = eqx.tree_at(lambda g: g.wte, grads, u * v[:32].T + 1e-3 * grads.wte)
        updates, _ = optimizer.update(grads, optimizer.init(PARAMS), PARAMS)
        singular = np.linalg.svd(np.asarray(updates.wte), compute_uv=False)
        return singular.max() / singular.min()

    # Adam's step keeps the gradient's one dominant direction; Newton-Schulz spreads it over every direction
    plain = first_update()
    orthogonal = first_update("optimizer.orthogonalize_embeddings=true", "optimizer.groups.adam.labels=[vector]")
    assert orthogonal < 50 and plain > 1e4, (orthogonal, plain)  # measured: 13 against 1.4e8


def test_sophia_gets_the_loss_from_the_train_step_and_equals_optax_own(data_cache):
    """The step hands the optimizer the micro-batch's loss (obj_fn): Sophia's Hutchinson estimate runs inside the
    compiled step; and the builder is optax.contrib.sophia with the config's values."""
    parts = build(tiny_overrides(data_cache, "optimizer=sophia", "optimizer.update_interval=1"))
    nu_before = [
        x for x in jax.tree.leaves(parts.state.opt_state) if getattr(x, "shape", None) == parts.state.model.wte.shape
    ]
    metrics = parts.step(0)
    assert np.isfinite(float(metrics["loss"]))
    nu_after = [
        x for x in jax.tree.leaves(parts.state.opt_state) if getattr(x, "shape", None) == parts.state.model.wte.shape
    ]
    assert any(not np.array_equal(a, b) for a, b in zip(nu_before, nu_after))  # the Hessian EMA moved
    by_hand = optax.contrib.sophia(
        0.01,
        b1=0.965,
        b2=0.99,
        eps=1e-12,
        weight_decay=0.2,
        gamma=0.05,
        weight_decay_mask=fixed(MODEL.weight_decay_mask()),
        update_interval=10,
    )
    loss_of = lambda p: jnp.sum(jnp.square(jax.tree.leaves(p)[0]))  # noqa: E731
    results = []
    for optimizer in (ours("optimizer=sophia"), by_hand):
        params, state = PARAMS, optimizer.init(PARAMS)
        update = jax.jit(lambda g, s, p, optimizer=optimizer: optimizer.update(g, s, p, obj_fn=loss_of))
        for i in range(3):
            grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(i), x.shape), params)
            updates, state = update(grads, state, params)
            params = optax.apply_updates(params, updates)
        results.append(params)
    for a, b in zip(*map(jax.tree.leaves, results)):
        np.testing.assert_allclose(a, b, **CHAIN_TOLERANCE)


def test_sophia_reports_the_share_of_clipped_coordinates_and_prodigy_its_estimate(data_cache):
    """optimizer/sophia_clipped: at the first step the Hessian EMA is 0, so every coordinate with any momentum is
    clipped; it falls as the EMA fills (refreshed every step here). optimizer/prodigy_d and dadapt_d: the estimate d
    in the state, grown from d0."""
    parts = build(
        tiny_overrides(data_cache, "optimizer=sophia", "optimizer.update_interval=1", "model.head_loss=dense")
    )
    shares = [float(parts.step(s)["optimizer/sophia_clipped"]) for s in range(6)]
    assert shares[0] > 0.9 and shares[-1] < shares[0] - 0.1, shares
    for name, key in (("prodigy", "prodigy_d"), ("dadapt_adamw", "dadapt_d")):
        parts = build(tiny_overrides(data_cache, f"optimizer={name}"))
        metrics = [parts.step(s) for s in range(4)]
        (state,) = [
            x for x in jax.tree.leaves(parts.state.opt_state, is_leaf=lambda x: hasattr(x, "d")) if hasattr(x, "d")
        ]
        assert float(metrics[-1][f"optimizer/{key}"]) == float(state.d) > parts.cfg.optimizer.d0


def test_sophia_with_the_chunked_head_is_one_config_line():
    with pytest.raises(ConfigError, match="^config: model.head_loss: sophia differentiates the loss twice"):
        load_config(["optimizer=sophia", "model.head_loss=chunked"])


@pytest.mark.parametrize(
    "overrides, refused",
    [  # μP's 1/m on the hidden matrices is Adam's rule: these stepped them by the wrong one, without a word
        (["optimizer=muon"], "muon"),
        (["optimizer=sgdm"], "sgdm"),
        (["optimizer=scion"], "scion"),
        (["optimizer=adamw", "+optimizer.groups={matrix: {name: sgdm}}"], "sgdm"),
        (["optimizer=muon", "optimizer.groups.adam.labels=[embedding, vector, matrix]"], None),  # Adam on the matrices
        (["optimizer=sgdm", "+optimizer.groups={matrix: {name: adamw}}"], None),
        (["optimizer=adamw"], None),
    ],
)
def test_mup_refuses_an_optimizer_whose_matrix_steps_follow_another_width_rule(overrides, refused):
    mup = ["model=gpt2-tiny", "model.parametrization=mup", "model.mup_base_width=32", *overrides]
    if refused is None:
        assert matrix_optimizers(load_config(mup).optimizer).isdisjoint(OWN_WIDTH_RULE)
        return
    with pytest.raises(ConfigError, match=f"^config: model.parametrization: μP divides .*; {refused} steps them"):
        load_config(mup)
    load_config([*mup, "model.parametrization=standard"])


def test_a_groups_value_that_its_builder_refuses_is_named_where_it_was_set():
    """A group's value outside its range (checked when the builder runs) and a value a group's optimizer needs that
    nothing sets: each error named the section's key (optimizer.ns_steps), where setting it was then refused."""
    cfg = load_config(["optimizer.groups={matrix: {name: muon, ns_steps: 0}}"])
    with pytest.raises(ConfigError, match=r"^config: optimizer\.groups\.matrix\.ns_steps: must be >= 1"):
        build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 10), MODEL, 1)
    with pytest.raises(
        ConfigError, match=r"^config: optimizer\.groups\.matrix\.scale_hidden: scion needs a value; set"
    ):
        load_config(["optimizer.groups={matrix: {name: scion, weight_decay: 0}}"])


def test_a_recipe_with_another_optimizer_names_every_key_to_clear_and_a_fix_that_loads():
    """recipe=speedrun-micro optimizer=adamw: the recipe's Muon keys were refused one by one (five runs to find them),
    and its `adam` group with a label error that named no way to remove it."""
    base = ["recipe=speedrun-micro", "optimizer=adamw"]
    with pytest.raises(ConfigError) as refused:
        load_config(base)
    line = str(refused.value)
    assert line.startswith("config: optimizer.orthogonalizer: adamw does not take it, nor optimizer.normuon_beta2")
    nulls = line.split("leave them null: ")[1].split()
    assert len(nulls) == 4 and all(n.endswith("=null") for n in nulls)
    with pytest.raises(ConfigError, match=r"removed with ~optimizer\.groups\.adam\)$"):
        load_config([*base, *nulls])
    assert load_config([*base, *nulls, "~optimizer.groups.adam"]).optimizer.name == "adamw"
