"""Muon (Jordan et al., 2024): momentum orthogonalised by Newton-Schulz iterations, for the blocks' weight matrices.

`optimizer=muon` (conf/optimizer/muon.yaml) is one use of the parameter groups (optimizers/groups.py): Muon for the
parameters of no group (the blocks' matrices), and a group `adam` of every embedding and vector with AdamW at a tenth
of the learning rate. A parameter that reaches this builder and is not a block matrix gets optax's Adam fallback.

Knobs: `ns_steps` (Newton-Schulz iterations, 5), `consistent_rms` (null: optax's width scaling sqrt(max(1, out/in));
0.2: D-Muon's matched-RMS scaling sqrt(max(in, out)) x 0.2, which gives the update AdamW's RMS, so that with decoupled
weight decay one lr and one decay serve both parts; Liu et al., 2025).
"""

from __future__ import annotations

from typing import Optional

import jax
import optax

from optimizers.decay import fixed
from optimizers.registry import register
from optimizers.reporting import report, rms


@register("muon")
def muon(
    model,
    *,
    momentum: float,
    nesterov: bool,
    beta1: float,
    beta2: float,
    weight_decay: float,
    ns_steps: int = 5,
    consistent_rms: Optional[float] = None,
    orthogonalize_embeddings: bool = False,
) -> optax.GradientTransformation:
    """The matrices are stacked [layer, in, *out]: axis 1 is reduced, the rest are the output, the layer axis is a
    batch axis. `orthogonalize_embeddings`: the token and position embeddings [rows, D] this optimizer gets are
    orthogonalised too (rows as the output, D reduced: the tied head's layout), instead of taking the Adam fallback."""
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

    muon_update = optax.contrib.muon(
        1.0,
        ns_steps=ns_steps,
        beta=momentum,
        nesterov=nesterov,
        weight_decay=weight_decay,
        weight_decay_mask=fixed(model.weight_decay_mask()),
        consistent_rms=consistent_rms,
        adam_b1=beta1,
        adam_b2=beta2,
        adam_weight_decay=weight_decay,
        muon_weight_dimension_numbers=dimensions,
    )
    return optax.chain(muon_update, report("muon_update_rms", rms))  # logged as optimizer/muon_update_rms
