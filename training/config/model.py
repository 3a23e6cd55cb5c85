"""The `model` section: the model's options (models/config.py defines them, once) with the run's label for the
model and its builder, and the checks on their values."""

from __future__ import annotations

from dataclasses import dataclass

from core.checks import fail, refuse_unread, require_positive
from models import MODEL_BUILDERS
from models.config import (  # noqa: F401 (the options' enums, imported from here by the rest of training/)
    Attention,
    HeadLoss,
    Mlp,
    ModelOptions,
    Norm,
    Parametrization,
    Position,
    Remat,
)


@dataclass(frozen=True)
class ModelConfig(ModelOptions):
    name: str = "gpt2-mini"  # label used in run names (model=<preset> sets it)
    arch: str = "gpt"  # a builder of the models registry (models/__init__.py MODEL_BUILDERS): gpt, models/gpt.py

    def check_read(self) -> None:
        rope = self.position == Position.rope
        rotary = f"rotary positions (model.position={self.position})"
        refuse_unread(
            self,
            "model",
            {
                "rope_theta": (rope, rotary, "model.position=rope"),
                "rope_frequencies": (rope, rotary, "model.position=rope"),
                "qk_norm_weight": (self.qk_norm, "QK-norm (model.qk_norm=false)", "model.qk_norm=true"),
                "logit_softcap_form": (
                    self.logit_softcap > 0,
                    "the soft-cap (logit_softcap=0: off)",
                    "logit_softcap > 0",
                ),
                "head_loss_chunk": (
                    self.head_loss != HeadLoss.dense,
                    "the chunked head (model.head_loss=dense)",
                    "model.head_loss=chunked",
                ),
            },
        )

    def check(self) -> None:
        if self.arch not in MODEL_BUILDERS:
            fail("model.arch", f"must be one of {', '.join(MODEL_BUILDERS)}; got {self.arch!r}")
        require_positive(
            self, "model", "n_layer", "n_head", "n_embd", "context_size", "vocab_multiple", "head_loss_chunk"
        )
        if self.n_embd % self.n_head:
            fail("model.n_embd", f"{self.n_embd} is not divisible by model.n_head={self.n_head}")
        if self.attention_window is not None and self.attention_window < 1:
            fail("model.attention_window", f"must be >= 1 (the query itself), or null; got {self.attention_window}")
        if self.yarn_windows and (
            self.attention_window is None
            or self.position != Position.rope
            or any(w < 1 for w in self.yarn_windows)
            or [*self.yarn_windows, self.attention_window] != sorted([*self.yarn_windows, self.attention_window])
        ):
            fail(
                "model.yarn_windows",
                f"{list(self.yarn_windows)}: YaRN stretches rotary positions (model.position=rope) through windows "
                f"that grow to model.attention_window={self.attention_window}",
            )
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            fail(
                "model.n_kv_head",
                f"{self.n_kv_head} must divide model.n_head={self.n_head}: each key/value head "
                "serves n_head / n_kv_head query heads",
            )
        head_dim = self.n_embd // self.n_head
        if self.position == Position.rope and head_dim % 2:
            fail(
                "model.position",
                f"rope turns pairs of a head's dimensions: the head size n_embd / n_head = "
                f"{self.n_embd} / {self.n_head} = {head_dim} must be even",
            )
        if self.position == Position.rope and self.rope_frequencies == "half_truncated" and head_dim % 4:
            fail(
                "model.rope_frequencies",
                f"half_truncated turns a quarter of a head's dimensions in pairs: the head size {head_dim} must be a "
                "multiple of 4",
            )
        if self.rope_theta <= 0:
            fail("model.rope_theta", f"must be > 0; got {self.rope_theta}")
        self.check_read()
        if self.mlp_hidden is not None and self.mlp_hidden < 1:
            fail("model.mlp_hidden", f"must be >= 1 or null (the MLP's default width); got {self.mlp_hidden}")
        require_positive(self, "model", "mup_base_width")
        if self.logit_softcap < 0:
            fail("model.logit_softcap", f"must be >= 0 (0 = off); got {self.logit_softcap}")
        if not 0.0 <= self.dropout < 1.0:
            fail("model.dropout", f"must be in [0, 1); got {self.dropout}")
        if not 0 <= 2 * self.value_embeddings <= self.n_layer:
            fail(
                "model.value_embeddings",
                f"the first k blocks and the last k take the k tables: needs 0 <= 2 k <= n_layer={self.n_layer}; "
                f"got {self.value_embeddings}",
            )
        if self.attention_scale is not None and self.attention_scale <= 0:
            fail("model.attention_scale", f"must be > 0 or null (1 / sqrt(head size)); got {self.attention_scale}")
        if self.attention_scale is not None and self.parametrization == "mup":
            fail(
                "model.attention_scale",
                "parametrization=mup scales the scores by 1 / head size itself; set attention_scale=null",
            )
        if self.unet_skips and self.n_layer < 2:
            fail(
                "model.unet_skips",
                f"joins the first half's blocks to the last half's: needs n_layer >= 2; got {self.n_layer}",
            )
