"""The coordinate check of μP (Yang et al., Tensor Programs V, §D.1): train models of several widths for a few steps
at one learning rate and watch the typical size of each activation's coordinates. Under standard parametrization
with Adam the change an update makes to the hidden activations and logits grows with the width (a lr that suits a
narrow model blows a wide one up); under μP (models/mup.py) it stays the same at every width.

Measured at each step t (before its update) on one fixed batch of real text (a Python standard-library source file,
byte tokens): the mean |coordinate| of the embedding output, of the residual stream after each block and of the
logits, and the mean |change since step 0| of each (what grows with width under standard parametrization).
scripts/experiments/coord_check.py draws it.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Literal, TypedDict

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from models.config import GPTConfig
from models.gpt import GPT
from optimizers import build_optimizer, build_schedule, own_warmups_in_steps
from training.config import load_config
from training.step.losses import mean_loss

TEXT = Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py"  # real text that every Python ships


class CoordCheck(TypedDict):
    """One parametrization's measurements (what `coord_check` returns and `write_json` writes)."""

    parametrization: str
    widths: list[int]
    steps: int
    lr: float
    optimizer: str
    size: dict[str, list[list[float]]]  # activation -> [[mean |x| per width] per step]
    change: dict[str, list[list[float]]]  # activation -> [[mean |x_t - x_0| per width] per step]


def text_batch(batch: int, length: int) -> dict[str, jax.Array]:
    """`batch` windows of `length` + 1 byte tokens of TEXT, one after another."""
    data = np.frombuffer(TEXT.read_bytes(), np.uint8).astype(np.int32)
    windows = np.stack([data[i * length : (i + 1) * length + 1] for i in range(batch)])
    x = jnp.asarray(windows)
    return {"inputs": x[:, :-1], "targets": x[:, 1:], "loss_mask": jnp.ones((batch, length), jnp.float32)}


def activations(model: GPT, tokens_BT: jax.Array) -> dict[str, jax.Array]:
    """The embedding output, each block's output (the residual stream) and the logits, float32."""
    cfg = model.cfg
    x = model.wte[tokens_BT] + (0 if model.wpe is None else model.wpe[jnp.arange(tokens_BT.shape[1])])
    out = {"embedding": x}
    params, static = eqx.partition(model.blocks, eqx.is_array)
    for i in range(cfg.n_layer):
        block = eqx.combine(jax.tree.map(lambda a: a[i], params), static)
        x, _ = block(x, cfg, None)
        out[f"block{i}"] = x
    out["logits"] = model(tokens_BT)
    return out


def coord_check(
    widths: list[int],
    parametrization: str,
    steps: int = 4,
    lr: float = 1e-2,
    n_layer: int = 2,
    n_head: int = 4,
    length: int = 64,
    batch: int = 8,
    seed: int = 0,
    optimizer: str = "adamw",
) -> CoordCheck:
    """{"widths", "steps", "size": {activation: [[mean |x| per width] per step]}, "change": {... |x_t - x_0| ...}};
    μP's base width is the narrowest."""
    data = text_batch(batch, length)
    size: dict[str, list[list[float]]] = {}
    change: dict[str, list[list[float]]] = {}
    for w_index, width in enumerate(widths):
        cfg = GPTConfig(
            vocab_size=256,
            n_layer=n_layer,
            n_head=n_head,
            n_embd=width,
            context_size=length,
            parametrization=parametrization,
            mup_base_width=widths[0],
        )
        model = GPT.init(cfg, jax.random.PRNGKey(seed))
        run = load_config(
            [
                f"optimizer={optimizer}",
                "optimizer/lr_config=constant",
                f"optimizer.lr_config.lr={lr}",
                "optimizer.lr_config.warmup=0",
                "optimizer.grad_clip=0",
            ],
            num_local_devices=1,
        )
        schedule = build_schedule(run.optimizer.lr_config, steps)
        opt = build_optimizer(own_warmups_in_steps(run.optimizer, steps), schedule, model, 1)
        state = opt.init(eqx.filter(model, eqx.is_array))

        @eqx.filter_jit
        def step(model, state):
            grads = eqx.filter_grad(mean_loss)(model, data, None, jnp.float32)
            updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), state

        measure = eqx.filter_jit(activations)
        first = None
        for t in range(steps + 1):
            acts = measure(model, data["inputs"])
            first = acts if first is None else first
            for name, x in acts.items():
                size.setdefault(name, [[0.0] * len(widths) for _ in range(steps + 1)])
                change.setdefault(name, [[0.0] * len(widths) for _ in range(steps + 1)])
                size[name][t][w_index] = float(jnp.mean(jnp.abs(x)))
                change[name][t][w_index] = float(jnp.mean(jnp.abs(x - first[name])))
            if t < steps:
                model, state = step(model, state)
    return {
        "parametrization": parametrization,
        "widths": widths,
        "steps": steps,
        "lr": lr,
        "optimizer": optimizer,
        "size": size,
        "change": change,
    }


def growth(result: CoordCheck, name: str, kind: Literal["change", "size"] = "change") -> float:
    """How much `name`'s measure at the last step grows from the narrowest to the widest model (a ratio)."""
    last = result[kind][name][-1]
    return last[-1] / max(last[0], 1e-30)


def write_json(results: list[CoordCheck], path: Path) -> None:
    path.write_text(json.dumps(results, indent=1))
