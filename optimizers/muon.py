"""Muon (Jordan et al., 2024): momentum orthogonalised by Newton-Schulz iterations, for the blocks' weight matrices.

`optimizer=muon` (conf/optimizer/muon.yaml) is one use of the parameter groups (optimizers/groups.py): Muon for the
parameters of no group (the blocks' matrices), and a group `adam` of every embedding and vector with AdamW at a tenth
of the learning rate. A parameter that reaches this builder and is not a block matrix gets optax's Adam fallback.

Knobs: `orthogonalizer` (`newton_schulz`: `ns_steps` quintic steps with Keller Jordan's coefficients (3.4445, -4.775,
2.0315) from X / ||X||_F; `polar_express`: Amsel et al. 2025's five steps, each with its own coefficients, from
X / (1.02 ||X||_F), the modded-nanogpt speedrun's), `ns_steps` (Newton-Schulz iterations, 5), `consistent_rms`
(null: optax's width scaling sqrt(max(1, out/in)); 0.2: D-Muon's matched-RMS scaling sqrt(max(in, out)) x 0.2, which
gives the update AdamW's RMS, so that with decoupled weight decay one lr and one decay serve both parts; Liu et al.,
2025).
"""

from __future__ import annotations

from typing import Optional

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


def polar_express_coefficients() -> jax.Array:
    """[5, 3] for optax's per-step Newton-Schulz: optax starts from X / ||X||_F, so the safety factor s goes into the
    first step's coefficients (a / s, b / s^3, c / s^5: the same polynomial of X / s)."""
    s = POLAR_EXPRESS_SAFETY
    (a, b, c), *rest = POLAR_EXPRESS
    return jnp.asarray(((a / s, b / s**3, c / s**5), *rest), jnp.float32)


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
    orthogonalizer: str = "newton_schulz",
    consistent_rms: Optional[float] = None,
    orthogonalize_embeddings: bool = False,
) -> optax.GradientTransformation:
    """The matrices are stacked [layer, in, *out]: axis 1 is reduced, the rest are the output, the layer axis is a
    batch axis. `orthogonalize_embeddings`: the token and position embeddings [rows, D] this optimizer gets are
    orthogonalised too (rows as the output, D reduced: the tied head's layout), instead of taking the Adam fallback."""
    if orthogonalizer not in ORTHOGONALIZERS:
        raise ConfigError(
            f"config: optimizer.orthogonalizer: must be one of {', '.join(ORTHOGONALIZERS)}; got {orthogonalizer!r}"
        )
    if orthogonalizer == "polar_express" and ns_steps != len(POLAR_EXPRESS):
        raise ConfigError(
            f"config: optimizer.ns_steps: polar_express's coefficients are for {len(POLAR_EXPRESS)} steps; "
            f"got {ns_steps}"
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

    muon_update = optax.contrib.muon(
        1.0,
        **({"ns_coeffs": polar_express_coefficients()} if orthogonalizer == "polar_express" else {}),
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
