"""What each parameter is, for the optimizers that treat tensors by their role in the network (mars, adam_mini,
scion, soap): the model's own labels (`GPT.parameter_labels`: token_embedding, head, position, attn_qkv, attn_out,
mlp_in, mlp_out, norm, bias), found by each leaf's path.

By path, not by a tree shaped like the model: a transformation may get only a parameter group's part of the model
(optimizers/groups.py: optax.partition puts empty nodes where the other groups' parameters were), and the paths of
the leaves it does get are the model's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax

from core.param_labels import MATRICES
from core.trees import path_name
from optimizers.protocols import OptimizedModel


class Role(NamedTuple):
    label: str  # the model's label
    # axis 0 indexes separate tensors: the layer of a leaf of the stacked blocks, the table of the value embeddings
    stacked: bool
    decayed: bool  # in the model's weight-decay mask (optimizers/decay.py)

    @property
    def is_matrix(self) -> bool:
        return self.label in MATRICES

    @property
    def in_axis(self) -> int:
        """A weight's input axis ([in, *out] per layer)."""
        return 1 if self.stacked else 0


def roles_of(model: OptimizedModel) -> dict[str, Role]:
    """Each parameter's path ("blocks.fc.weight") -> its role."""

    def by_path(tree: chex.ArrayTree) -> dict[str, Any]:  # the leaves: booleans, labels
        return {path_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}

    decayed = by_path(model.weight_decay_mask())
    return {
        name: Role(label, name.startswith("blocks.") or label == "value_embedding", bool(decayed[name]))
        for name, label in by_path(model.parameter_labels()).items()
    }


def map_roles(
    f: Callable[..., chex.ArrayTree], roles: dict[str, Role], tree: chex.ArrayTree, *rest: chex.ArrayTree
) -> chex.ArrayTree:
    """f(role, leaf, *the other trees' leaves or subtrees at its place) over the leaves of `tree`."""
    return jax.tree_util.tree_map_with_path(lambda path, x, *r: f(roles[path_name(path)], x, *r), tree, *rest)
