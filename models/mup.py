"""μP (maximal update parametrization; Yang et al., "Tensor Programs V", arXiv:2203.03466), for Adam-style optimizers:
`model.parametrization=mup` with `model.mup_base_width` d0 makes a model of width d = m d0 train like the base one,
so that a learning rate tuned at d0 (on gpt2-micro) stays the best at 4 x d0 (scripts/experiments/coord_check.py
checks it).

What changes with m = d / d0 (at m = 1 every factor is 1: the base model is standard GPT-2):
  hidden matrices (qkv, attn_proj, fc, mlp_proj)  init std / sqrt(m) (variance 1/fan_in relative to the base)
                                                  Adam lr / m (optimizers/__init__.py `mup_lr_scale`, on
                                                  core/param_labels.py's BLOCK_MATRICES)
  attention scores                                q.k / head_dim instead of / sqrt(head_dim): queries times
                                                  sqrt(head_dim0 / head_dim) = 1/sqrt(m) (heads fixed, so
                                                  head_dim = m head_dim0)
  readout (the LM head's input)                   times 1/m: the logits of a wider model stay O(1) as its (tied)
                                                  embedding trains at an lr that does not shrink with width
  embeddings, norms, biases                       unchanged: init and lr as at the base
The tied embedding is read out through the 1/m multiplier (the "shared readout" of the μP package's GPT-2 example).
Widening changes n_embd at a fixed n_head, as the coordinate check and the transfer sweep do: the base model has this
model's heads (a new run's config refuses a base width that is not a multiple of n_head). Decoupled weight decay is
part of the hidden matrices' step, divided by m with it (the μP package's `decoupled_wd=True`).
"""

from __future__ import annotations

import math
from typing import Protocol


class Widths(Protocol):
    """GPTConfig (models/config.py) as far as μP reads it: its width multiplier m."""

    @property
    def width_multiplier(self) -> float: ...


def hidden_init_std(cfg: Widths, std: float) -> float:
    """The hidden matrices' init std: `std` at the base width, / sqrt(m) around it."""
    return std / math.sqrt(cfg.width_multiplier)


def attention_multiplier(cfg: Widths) -> float:
    """The queries' factor that turns 1/sqrt(head_dim) scores into sqrt(head_dim0)/head_dim ones: 1/sqrt(m)."""
    return 1.0 / math.sqrt(cfg.width_multiplier)


def output_multiplier(cfg: Widths) -> float:
    """The readout's 1/m."""
    return 1.0 / cfg.width_multiplier
