"""Muon (Jordan et al., 2024): momentum orthogonalised by Newton-Schulz iterations, for the blocks' weight matrices.

`optimizer=muon` (conf/optimizer/muon.yaml) is one use of the parameter groups (optimizers/groups.py): Muon for the
parameters of no group (the blocks' matrices), and a group `adam` of every embedding and vector with AdamW at 0.2x
the learning rate (the leaderboard's tuned multiplier). A parameter that reaches this builder and is not a block
matrix gets optax's Adam fallback: AdamW at beta1 and beta2 with Muon's `nesterov` (so NAdam's update by default)
and optax's eps (1e-8), decayed where the model decays it.

`momentum_warmup` (steps, or a fraction of the run below 1; 0: off) and `momentum_start`: Muon's momentum rises
linearly from momentum_start to `momentum` over the warm-up (the speedrun's 0.85 -> 0.95 over 300 steps);
`momentum_cooldown` (likewise) and `momentum_end`: over the run's last steps it falls linearly from `momentum` towards
momentum_end (the speedrun's 0.95 -> 0.85 over the last 50), which needs the run's length (`run_steps`).
`normuon_beta2` (null: off; 0.95 in the speedrun): NorMuon's per-neuron second moment normalises each orthogonalised
matrix (`scale_by_normuon`). `cautious_weight_decay`: the blocks' matrices decay only where the update moves them
towards 0 already (`descent_decay`); with either, Muon's decay is applied after them (still times the schedule's lr).
Knobs: `orthogonalizer` (`newton_schulz`: `ns_steps` quintic steps with Keller Jordan's coefficients (3.4445, -4.775,
2.0315) from X / ||X||_F; `polar_express`: Amsel et al. 2025's five steps, each with its own coefficients, from
X / (1.02 ||X||_F), the modded-nanogpt speedrun's), `ns_steps` (Newton-Schulz iterations, 5), `consistent_rms`
(null: optax's width scaling sqrt(max(1, out/in)); 0.2: D-Muon's matched-RMS scaling sqrt(max(in, out)) x 0.2, which
gives the update AdamW's RMS, so that with decoupled weight decay one lr and one decay serve both parts; Liu et al.,
2025).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from core.errors import ConfigError
from optimizers.decay import fixed
from optimizers.registry import register
from optimizers.reporting import report, rms

# Polar Express (Amsel, Persson, Musco, Gower 2025, arXiv 2505.16932): per-step coefficients (a, b, c) of
# X <- a X + (b A + c A^2) X, A = X X^T, computed for 5 steps with safety factor 0.02 and cushion 2, as the
# modded-nanogpt speedrun uses them on X / (||X||_F (1 + 0.02)).
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
POLAR_EXPRESS_SAFETY = 1.02
ORTHOGONALIZERS = ("newton_schulz", "polar_express")
# optax.contrib.muon's arguments that are not numbers a schedule may drive (inject_hyperparams would call a function
# argument with the step count)
MUON_STATIC_ARGS = (
    "ns_coeffs",
    "ns_steps",
    "weight_decay_mask",
    "muon_weight_dimension_numbers",
    "nesterov",
    "mu_dtype",
)


def polar_express_coefficients() -> jax.Array:
    """[5, 3] for optax's per-step Newton-Schulz: optax starts from X / ||X||_F, so the safety factor s goes into the
    first step's coefficients (a / s, b / s^3, c / s^5: the same polynomial of X / s)."""
    s = POLAR_EXPRESS_SAFETY
    (a, b, c), *rest = POLAR_EXPRESS
    return jnp.asarray(((a / s, b / s**3, c / s**5), *rest), jnp.float32)


@register(
    "muon",
    bounds={"consistent_rms": "positive"},
    width_rule="orthogonalised, at a size its shape factor sets (consistent_rms)",
)
def muon(
    model,
    *,
    momentum: float,
    nesterov: bool,
    beta1: float,
    beta2: float,
    weight_decay: float,
    ns_steps: int = 5,
    orthogonalizer: str = "newton_schulz",
    normuon_beta2: Optional[float] = None,
    cautious_weight_decay: bool = False,
    momentum_warmup: float = 0,
    momentum_start: float = 0.85,
    momentum_cooldown: float = 0,
    momentum_end: float = 0.85,
    consistent_rms: Optional[float] = None,
    orthogonalize_embeddings: bool = False,
    run_steps: Optional[int] = None,
) -> optax.GradientTransformation:
    """The matrices are stacked [layer, in, *out]: axis 1 is reduced, the rest are the output, the layer axis is a
    batch axis. `orthogonalize_embeddings`: the token and position embeddings [rows, D] this optimizer gets are
    orthogonalised too (rows as the output, D reduced: the tied head's layout), instead of taking the Adam fallback."""
    if orthogonalizer not in ORTHOGONALIZERS:
        raise ConfigError(
            f"config: optimizer.orthogonalizer: must be one of {', '.join(ORTHOGONALIZERS)}; got {orthogonalizer!r}"
        )
    if ns_steps < 1:
        raise ConfigError(f"config: optimizer.ns_steps: must be >= 1 (the orthogonaliser's iterations); got {ns_steps}")
    if orthogonalizer == "polar_express" and ns_steps != len(POLAR_EXPRESS):
        raise ConfigError(
            f"config: optimizer.ns_steps: polar_express's coefficients are for {len(POLAR_EXPRESS)} steps; "
            f"got {ns_steps}"
        )
    if normuon_beta2 is not None and not 0.0 <= normuon_beta2 < 1.0:
        raise ConfigError(f"config: optimizer.normuon_beta2: must be in [0, 1) or null (off); got {normuon_beta2}")
    own_decay = normuon_beta2 is not None or cautious_weight_decay  # the decay comes after NorMuon / is gated
    if own_decay and orthogonalize_embeddings:
        raise ConfigError(
            "config: optimizer.orthogonalize_embeddings: NorMuon and cautious weight decay act on the blocks' "
            "matrices only; set orthogonalize_embeddings=false or turn them off"
        )
    is_matrix = model.block_matrices_mask()
    labels = model.parameter_labels()
    embedding = optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=0)

    def dimensions(params):
        """Orthogonalise the blocks' matrices this optimizer gets (a parameter group's are a part of them)."""

        def spec(m, label, w):
            if not hasattr(w, "ndim"):
                return None
            if m:
                return optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=tuple(range(2, w.ndim)))
            return embedding if orthogonalize_embeddings and label in ("token_embedding", "position") else None

        return jax.tree.map(spec, is_matrix, labels, params)

    if momentum_warmup < 0 or not 0.0 <= momentum_start < 1.0:
        raise ConfigError(
            "config: optimizer.momentum_warmup, momentum_start: the warm-up must be >= 0 steps and its start in "
            f"[0, 1); got {momentum_warmup}, {momentum_start}"
        )
    # Momentum warm-up and cool-down (the speedrun's: 0.85 -> 0.95 over the first 300 steps, back to 0.85 over the
    # last 50): optax's Muon with its beta a function of the step
    muon = optax.contrib.muon
    beta = momentum
    if momentum_warmup or momentum_cooldown:
        muon = optax.inject_hyperparams(muon, static_args=MUON_STATIC_ARGS)
        beta = momentum_schedule(momentum, momentum_warmup, momentum_start, momentum_cooldown, momentum_end, run_steps)
    muon_update = muon(
        1.0,
        **({"ns_coeffs": polar_express_coefficients()} if orthogonalizer == "polar_express" else {}),
        ns_steps=ns_steps,
        beta=beta,
        nesterov=nesterov,
        weight_decay=0.0 if own_decay else weight_decay,
        weight_decay_mask=fixed(model.weight_decay_mask()),
        consistent_rms=consistent_rms,
        adam_b1=beta1,
        adam_b2=beta2,
        adam_weight_decay=0.0,  # optax's Adam branch would decay all it gets: its decay follows the mask, below
        muon_weight_dimension_numbers=dimensions,
    )
    steps = [muon_update]
    # AdamW's decay on what the Adam branch takes (what Muon does not orthogonalise) where the model decays it: not
    # the norms, biases and positions (a step is already negated: -wd x w)
    orthogonalised_embeddings = ("token_embedding", "position") if orthogonalize_embeddings else ()
    adam_decayed = jax.tree.map(
        lambda decays, m, label: bool(decays) and not m and label not in orthogonalised_embeddings,
        model.weight_decay_mask(),
        is_matrix,
        labels,
    )
    if weight_decay:
        steps.append(optax.masked(optax.add_decayed_weights(-weight_decay), fixed(adam_decayed)))
    if normuon_beta2 is not None:
        steps.append(optax.masked(scale_by_normuon(normuon_beta2), fixed(is_matrix)))
    if own_decay and weight_decay:
        steps.append(optax.masked(descent_decay(weight_decay, cautious_weight_decay), fixed(is_matrix)))
    return optax.chain(*steps, report("muon_update_rms", rms))  # logged as optimizer/muon_update_rms


def cooldown_steps(cooldown: float, end: float, run_steps: Optional[int]) -> float:
    """The momentum cool-down's length in steps (`cooldown` below 1: a fraction of the run's `run_steps`), checked
    with its end value: the config checks them too (training/config/root.py), before any data is read."""
    if cooldown < 0 or not 0.0 <= end < 1.0:
        raise ConfigError(
            "config: optimizer.momentum_cooldown, momentum_end: the cool-down must be >= 0 steps and its end in "
            f"[0, 1); got {cooldown}, {end}"
        )
    if cooldown and run_steps is None:
        raise ConfigError(
            "config: optimizer.momentum_cooldown: the cool-down ends with the run, whose length is not known here "
            "(build_optimizer's run_steps); set it to 0"
        )
    length = (max(1, round(cooldown * run_steps)) if cooldown < 1 else cooldown) if cooldown else 0
    if run_steps is not None and length > run_steps:
        raise ConfigError(f"config: optimizer.momentum_cooldown: {length:g} steps exceed the run's {run_steps}")
    return length


def momentum_schedule(
    momentum: float, warmup: float, start: float, cooldown: float, end: float, run_steps: Optional[int]
) -> optax.Schedule:
    """Muon's momentum at update `count` (from 0): from `start` up to `momentum` over `warmup` steps, then from
    `momentum` down towards `end` over the run's last `cooldown` steps (a fraction of `run_steps` when below 1), and
    `end` after the run's `run_steps`; where the two overlap, the lower of the two."""
    length = cooldown_steps(cooldown, end, run_steps)
    first = (run_steps or 0) - length  # the cool-down's first update (counted from 0)

    def beta(count):
        b = momentum
        if warmup:
            b = start + jnp.minimum(count / warmup, 1.0) * (momentum - start)
        if length:  # past the schedule's end (lr_config.max_steps < train.max_steps) it holds at `end`
            done = jnp.clip((count - first) / length, 0.0, 1.0)
            b = jnp.minimum(b, momentum - done * (momentum - end))  # a warm-up not yet done by then: the lower
        return b

    return beta


class NorMuonState(NamedTuple):
    second_moment: optax.Updates  # per matrix [L, 1, out] or [L, in, 1]: the longer side's mean squared update


def _matrices(u: jax.Array) -> jax.Array:
    """A stacked block matrix [L, in, *out] as [L, in, out] in float32."""
    return u.reshape(*u.shape[:2], -1).astype(jnp.float32)


def _reduced_axis(u3: jax.Array) -> int:
    """NorMuon keeps a statistic for each entry of the longer side, averaged over the shorter: over `in` (axis 1)
    when out >= in, else over `out` (axis 2)."""
    return 1 if u3.shape[2] >= u3.shape[1] else 2


def scale_by_normuon(beta2: float) -> optax.GradientTransformation:
    """NorMuon (Li et al. 2025, arXiv 2510.05491), as the modded-nanogpt speedrun runs it after the orthogonalisation:
    v <- beta2 v + (1 - beta2) mean(u^2) over the shorter side (no bias correction); u <- u / sqrt(max(v, 1e-10)),
    rescaled to the Frobenius norm u had (each layer of the stack on its own)."""

    def init(params):
        def zeros(p):
            u3 = _matrices(p)
            shape = list(u3.shape)
            shape[_reduced_axis(u3)] = 1
            return jnp.zeros(shape, jnp.float32)

        return NorMuonState(jax.tree.map(zeros, params))

    def update(updates, state, params=None):
        del params

        def one(u, v):
            u3 = _matrices(u)
            mean = jnp.mean(jnp.square(u3), axis=_reduced_axis(u3), keepdims=True)
            v = beta2 * v + (1 - beta2) * mean
            scaled = u3 * jax.lax.rsqrt(jnp.maximum(v, 1e-10))
            norm = jnp.sqrt(jnp.sum(jnp.square(u3), axis=(1, 2), keepdims=True))
            scaled_norm = jnp.sqrt(jnp.sum(jnp.square(scaled), axis=(1, 2), keepdims=True))
            return (scaled * (norm / jnp.maximum(scaled_norm, 1e-10))).reshape(u.shape).astype(u.dtype), v

        pairs = jax.tree.map(one, updates, state.second_moment)
        outer = jax.tree.structure(updates)
        new_updates, second = jax.tree.transpose(outer, jax.tree.structure((0, 0)), pairs)
        return new_updates, NorMuonState(second)

    return optax.GradientTransformation(init, update)


def descent_decay(weight_decay: float, cautious: bool) -> optax.GradientTransformation:
    """Decoupled weight decay on a descent direction (the update already points downhill: -weight_decay x w added).
    `cautious` (Chen et al. 2025, arXiv 2510.12402; the speedrun's): only where the update moves w towards 0 already
    (update x w <= 0), so the decay never pushes against the step."""

    def update(updates, state, params):
        def one(u, w):
            decay = weight_decay * w.astype(u.dtype)
            return u - (jnp.where(u * w <= 0, decay, 0.0) if cautious else decay)

        return jax.tree.map(one, updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
