"""Adafactor (Shazeer & Stern, 2018), as optax.adafactor: a factored second moment (row and column means of g^2 for
a matrix whose two largest dimensions are >= min_dim_size_to_factor, per layer of the stacked blocks), decay
1 - t^-decay_rate, each leaf's update clipped to RMS <= clipping_threshold, scaled by the leaf's RMS
(multiply_by_parameter_scale: the lr is then relative to the weights' size), optional momentum (an EMA, 0 = none,
the paper's choice) and decoupled weight decay on the matrices.

The pipeline's lr multiplies the whole step, decay included (lr x weight_decay x w, as AdamW; optax's own adafactor
adds weight_decay x w after its lr, unscaled; the two agree at lr 1). The paper's relative step min(1e-2, 1/sqrt(t))
is the schedule's job here: the preset asks for lr 1e-2 with the cosine shape. A "block" for the clipping and the
parameter scale is a leaf: the stacked blocks' matrices are one leaf for all layers."""

from __future__ import annotations

import optax

from optimizers.decay import fixed
from optimizers.registry import register


@register(
    "adafactor",
    bounds={
        "min_dim_size_to_factor": "count",
        "decay_rate": "positive",
        "decay_offset": "non_negative",
        "clipping_threshold": "non_negative",
    },
)
def adafactor(
    model,
    *,
    factored: bool,
    min_dim_size_to_factor: int,
    decay_rate: float,
    decay_offset: int,
    multiply_by_parameter_scale: bool,
    clipping_threshold: float,
    momentum: float,
    eps: float,
    weight_decay: float,
) -> optax.GradientTransformation:
    """clipping_threshold, momentum, weight_decay: 0 turns each off."""
    return optax.adafactor(
        1.0,
        min_dim_size_to_factor=min_dim_size_to_factor,
        decay_rate=decay_rate,
        decay_offset=decay_offset,
        multiply_by_parameter_scale=multiply_by_parameter_scale,
        clipping_threshold=clipping_threshold or None,
        momentum=momentum or None,
        weight_decay_rate=weight_decay or None,
        eps=eps,
        factored=factored,
        weight_decay_mask=fixed(model.weight_decay_mask()),
    )
