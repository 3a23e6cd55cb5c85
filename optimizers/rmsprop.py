"""RMSprop; momentum 0 turns the momentum buffer off. L2 weight decay on the matrices.

With momentum, the buffer accumulates unscaled steps and the learning rate multiplies its output, as in PyTorch
(optax scales inside the momentum; the two agree while the lr is constant). `eps` is inside the root, optax's
g / sqrt(v + eps), where PyTorch's is g / (sqrt(v) + eps): eps 1e-8 here bounds the denominator below by 1e-4, not
1e-8, so the two differ where |g| is below ~1e-4 (the leaderboard tuned it so)."""

from __future__ import annotations

import optax

from optimizers.decay import l2
from optimizers.registry import register


@register("rmsprop")
def rmsprop(model, *, decay: float, eps: float, momentum: float, weight_decay: float) -> optax.GradientTransformation:
    return optax.chain(
        l2(weight_decay, model.weight_decay_mask()), optax.rmsprop(1.0, decay=decay, eps=eps, momentum=momentum or None)
    )
