"""COCOB-Backprop (Orabona & Tommasi, 2017, "Training Deep Networks without Learning Rates Through Coin Betting"), as
optax.contrib.cocob: each coordinate bets a fraction of its "wealth" L + reward on the sign of the summed negative
gradients, w = w_1 + theta / (L max(G + L, alpha L)) x (L + reward); no learning rate. Weight decay is L2 on the
matrices, added to the gradient (optax's form; the paper has none).

The direction is w_new - w, which the run's lr schedule does not scale (registered with lr="own"): the method as
published has no learning rate."""

from __future__ import annotations

import optax

from optimizers.decay import fixed
from optimizers.registry import register


@register("cocob", lr="own", bounds={"alpha": "positive"}, step_size="alpha")
def cocob(model, *, alpha: float, eps: float, weight_decay: float) -> optax.GradientTransformation:
    """eps: the initial scale L_0 of each coordinate's gradients (keeps the first bet finite)."""
    return optax.contrib.cocob(
        1.0, alpha=alpha, eps=eps, weight_decay=weight_decay, mask=fixed(model.weight_decay_mask())
    )
