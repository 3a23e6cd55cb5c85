"""What an optimizer measures about itself, read from its state for the log.

The optimizer keeps the numbers in its state (as trainit's optimizers keep a log there) and knows nothing of logging;
this module names them. A reader registered for a state type (`@reads(StateType)`) turns one such state into named
scalars; `optimizer_metrics(opt_state)` finds every state of a registered type anywhere in the pipeline's state
(chains, MultiSteps, parameter groups) and returns `optimizer/<name>`, or `optimizer/<group>/<name>` inside a
parameter group. The train step returns them with its metrics, and the log writes them with the loss (console,
metrics.jsonl, TensorBoard, wandb).

`report(name, measure)` is a transformation that measures the updates passing through it and keeps the value in its
state, for what no state holds already (Muon's update RMS).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

# A reader takes one state of the type it is registered for: the registry holds readers of many state types.
Reader = Callable[[Any], dict[str, jax.Array]]
READERS: dict[type, Reader] = {}


def reads(state_type: type) -> Callable[[Reader], Reader]:
    """`@reads(StateType)` on `reader(state) -> {name: scalar}`."""

    def add(reader: Reader) -> Reader:
        READERS[state_type] = reader
        return reader

    return add


class Reported(NamedTuple):
    values: dict[str, jax.Array]


def report(name: str, measure: Callable[[optax.Updates], jax.Array]) -> optax.GradientTransformation:
    """Passes the updates through unchanged and keeps `measure(updates)` (float32 scalar) as `name`."""

    def init(params):
        del params
        return Reported({name: jnp.zeros([], jnp.float32)})

    def update(updates, state, params=None):
        del state, params
        return updates, Reported({name: jnp.asarray(measure(updates), jnp.float32)})

    return optax.GradientTransformation(init, update)


def rms(tree: chex.ArrayTree) -> jax.Array:
    """Root mean square over every entry of the tree's arrays."""
    leaves = jax.tree.leaves(tree)
    total = sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)
    return jnp.sqrt(total / max(sum(x.size for x in leaves), 1))


@reads(Reported)
def _reported(state: Reported) -> dict[str, jax.Array]:
    return state.values


@reads(optax.contrib.MechanicState)
def _mechanic(state: optax.contrib.MechanicState) -> dict[str, jax.Array]:
    return {"mechanic_scale": jnp.sum(state.s)}  # the learned scale of the base optimizer's updates


@reads(optax.contrib.ScheduleFreeState)
def _schedule_free(state: optax.contrib.ScheduleFreeState) -> dict[str, jax.Array]:
    # the newest iterate's weight in the average x is max_lr^weight_lr_power / weight_sum
    return {"schedule_free_weight_sum": state.weight_sum, "schedule_free_max_lr": state.max_lr}


def optimizer_metrics(opt_state: optax.OptState) -> dict[str, jax.Array]:
    """Every registered state's numbers in the optimizer state, named by the parameter group they are in; a state
    that wraps another optimizer's (Mechanic's) is read and so are the ones inside it (the flattening stopped at the
    wrapper: with optimizer.mechanic=true, Muon's update RMS and Prodigy's d were no longer logged)."""
    metrics: dict[str, jax.Array] = {}

    def read(node: Any, above: tuple) -> None:
        inner = lambda x: x is not node and type(x) in READERS  # noqa: E731
        for path, state in jax.tree_util.tree_flatten_with_path(node, is_leaf=inner)[0]:
            reader = READERS.get(type(state))
            if reader is None:
                continue
            keys = (*above, *path)
            groups = [k.key for k in keys if isinstance(k, jax.tree_util.DictKey) and isinstance(k.key, str) and k.key]
            prefix = "optimizer/" + "".join(f"{g}/" for g in groups[-1:])
            metrics.update({prefix + name: value for name, value in reader(state).items()})
            read(state, keys)

    read([opt_state], ())  # in a list: the whole state may be one that is read (Kron's)
    return metrics
