"""Sophia (Liu, Li, Hall, Liang & Ma, 2023, "Sophia: A Scalable Stochastic Second-order Optimizer for Language Model
Pre-training", arXiv:2305.14342), from optax.contrib.sophia: momentum divided by gamma x an EMA of the Hessian's
diagonal, clipped elementwise to [-1, 1]; the diagonal is Hutchinson's estimate u * (H u) with Rademacher u, refreshed
every `update_interval` steps (Sophia-H). Decoupled weight decay on the matrices.

The Hessian-vector product needs the loss: the train step hands every optimizer `obj_fn`, the micro-batch's mean
loss as a function of the parameters (training/step/train_step.py); the others ignore it. The pipeline's lr is
Sophia's step size (the paper's peak lr, with the run's schedule).
"""

from __future__ import annotations

import optax

from optimizers.decay import fixed
from optimizers.registry import register


@register("sophia")
def sophia(model, *, beta1: float, beta2: float, eps: float, weight_decay: float, gamma: float = 0.01,
           clip_threshold: float = 1.0, update_interval: int = 10) -> optax.GradientTransformation:
    return optax.contrib.sophia(1.0, b1=beta1, b2=beta2, eps=eps, weight_decay=weight_decay,
                                weight_decay_mask=fixed(model.weight_decay_mask()), gamma=gamma,
                                clip_threshold=clip_threshold, update_interval=update_interval)
