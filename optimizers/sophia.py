"""Sophia (Liu, Li, Hall, Liang & Ma, 2023, "Sophia: A Scalable Stochastic Second-order Optimizer for Language Model
Pre-training", arXiv:2305.14342), from optax.contrib.sophia: momentum divided by gamma x an EMA of the Hessian's
diagonal, clipped elementwise to [-1, 1]; the diagonal is Hutchinson's estimate u * (H u) with Rademacher u, refreshed
every `update_interval` steps (Sophia-H). Decoupled weight decay on the matrices.

The Hessian-vector product needs the loss: the train step hands every optimizer `obj_fn`, the micro-batch's mean
loss as a function of the parameters (training/step/train_step.py); the others ignore it. Under gradient
accumulation the update, and with it the estimate, is made at the step's last micro-batch: the Hessian's diagonal is
estimated on that micro-batch, the momentum on the whole step's gradient. The pipeline's lr is
Sophia's step size (the paper's peak lr, with the run's schedule).

Logged as optimizer/sophia_clipped: the share of coordinates whose ratio m / (gamma h) was clipped, 1 minus what the
authors call the win rate (they ask for a win rate of 0.1-0.5). optax's EMA of the Hessian's diagonal starts at 0
with no bias correction and moves every update_interval steps, so early in a run (8 refreshes in 80 steps: 8% of the
diagonal) nearly every coordinate is clipped and Sophia steps as sign momentum: this number shows when that is so.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from optimizers.decay import fixed
from optimizers.registry import register
from optimizers.reporting import report


@register("sophia", bounds={"gamma": "positive", "clip_threshold": "positive", "update_interval": "count"})
def sophia(
    model,
    *,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    gamma: float = 0.01,
    clip_threshold: float = 1.0,
    update_interval: int = 10,
) -> optax.GradientTransformation:
    # optax.contrib.sophia at lr 1, its decay added after the clip share is measured on its clipped ratios (negated)
    return optax.chain(
        optax.contrib.sophia(
            1.0,
            b1=beta1,
            b2=beta2,
            eps=eps,
            weight_decay=0.0,
            gamma=gamma,
            clip_threshold=clip_threshold,
            update_interval=update_interval,
        ),
        report("sophia_clipped", lambda u: clipped_share(u, clip_threshold)),
        optax.add_decayed_weights(-weight_decay, fixed(model.weight_decay_mask())),
    )


def clipped_share(ratios, clip_threshold: float):
    """The share of entries at the clip (|ratio| = threshold after clipping)."""
    leaves = jax.tree.leaves(ratios)
    return sum(jnp.sum(jnp.abs(x) >= clip_threshold) for x in leaves) / max(sum(x.size for x in leaves), 1)
