"""Muon (orthogonalised momentum) on the blocks' weight matrices, AdamW on everything else."""

from __future__ import annotations

import jax
import optax

from optimizers.decay import fixed
from optimizers.registry import register


@register("muon")
def muon(model, *, momentum: float, nesterov: bool, beta1: float, beta2: float, eps: float, weight_decay: float,
         adam_lr_ratio: float) -> optax.GradientTransformation:
    """The matrices are stacked [layer, in, *out]: axis 1 is reduced, the rest are the output, the layer axis is a
    batch axis. The AdamW part decays the other matrices (the embedding) and runs at adam_lr_ratio x the lr."""
    is_matrix = model.block_matrices_mask()
    labels = jax.tree.map(lambda m: "muon" if m else "adamw", is_matrix)
    decay_mask = jax.tree.map(lambda d, m: d and not m, model.weight_decay_mask(), is_matrix)
    orthogonalised = optax.contrib.muon(
        1.0,
        beta=momentum,
        nesterov=nesterov,
        weight_decay=weight_decay,
        muon_weight_dimension_numbers=lambda params: jax.tree.map(
            lambda w: optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=tuple(range(2, w.ndim))),
            params),
    )
    adamw = optax.adamw(adam_lr_ratio, beta1, beta2, eps, weight_decay=weight_decay, mask=fixed(decay_mask))
    return optax.partition({"muon": orthogonalised, "adamw": adamw}, fixed(labels))
