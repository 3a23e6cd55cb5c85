"""Modifiers of any optimizer's direction, switched on in the `optimizer` section.

cautious (Liang et al., 2024, "Cautious Optimizers", arXiv:2411.16085): of the direction, keep the entries that point
downhill (whose sign is the negative gradient's) and zero the others; each tensor is then rescaled by its size over
the kept count (+1), so the step's size stays that of the full direction. It wraps each optimizer's direction
(optimizers/decay.py's with_decay_mode): an optimizer's own decay is part of it and masked with it, while the paper
decays every weight unmasked, which `weight_decay_mode=decoupled` gives (its decay is added after the mask).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def cautious(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    def update(grads, state, params=None, **extra):
        updates, state = inner.update(grads, state, params, **extra)

        def keep_downhill(u, g):
            downhill = (u * g < 0).astype(u.dtype)  # the direction is already negated: descent is u . g < 0
            return u * downhill * (downhill.size / (jnp.sum(downhill) + 1))

        return jax.tree.map(keep_downhill, updates, grads), state

    return optax.GradientTransformationExtraArgs(inner.init, update)
