"""The model's options, defined once. `ModelOptions` is every hyper-parameter of the network (its shape and how it
computes): the `model` config section is these fields plus the run's label and builder (training/config/model.py),
and `GPTConfig` (below) is these fields plus the vocabulary's size: the static description a model is built
from, that checkpoints' config.yaml records and the Hugging Face export reads. An option is one field here, with its
meaning as a comment (what `--help` prints), and the code that uses it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from models.mlp import mlp_hidden_width


class Attention(StrEnum):
    """The attention kernel (models/attention.py)."""

    auto = "auto"  # cuDNN's fused kernel where it runs (NVIDIA GPU, 16-bit), else blocked on CPU, else xla
    xla = "xla"  # jax.nn.dot_product_attention's XLA path: the full score matrix, masked
    cudnn = "cudnn"  # cuDNN's fused (flash) kernel; fails at start where it cannot run
    blocked = "blocked"  # by query blocks, skipping the masked half: faster on CPU


class HeadLoss(StrEnum):
    """How the LM head and the loss over the vocabulary run (models/lm_head.py)."""

    # chunked on a GPU (gpt2, batch 32: 1.049x dense's tokens/s on an H100, 1.033x on an H200, 3 GiB less), dense
    # elsewhere and with an optimizer that differentiates the loss twice (sophia)
    auto = "auto"
    dense = "dense"  # the float32 logits [B, T, V] at once
    chunked = "chunked"  # model.head_loss_chunk tokens at a time, with a custom backward pass: no [B, T, V] array


class LogitsDtype(StrEnum):
    """The LM head's logits as its matmul writes them (models/lm_head.py); log Z, the softmax and the loss read them
    in float32 either way, and the matmul accumulates in float32."""

    # compute on a GPU (gpt2, bf16, batch 32: 476,550 tokens/s against float32's 458,227 on an H100, 3 GiB less),
    # float32 elsewhere
    auto = "auto"
    float32 = "float32"
    # the compute dtype (bfloat16 at system.dtype=bfloat16 or fp8, as nanoGPT's logits under autocast): half the bytes
    # each pass over the [B, T, V] logits moves; float32 runs are unchanged
    compute = "compute"


class Remat(StrEnum):
    """What the backward pass recomputes instead of keeping (models/gpt.py)."""

    none = "none"  # keep every activation
    block = "block"  # keep the matmul outputs, recompute the elementwise work
    full = "full"  # keep each block's input, recompute the whole block


class Parametrization(StrEnum):
    """How init, attention scale, readout and learning rates depend on width (models/mup.py)."""

    standard = "standard"  # GPT-2's: the same init std, 1/sqrt(head_dim) scores and lr at every width
    mup = "mup"  # μP: a lr tuned at model.mup_base_width stays the best at other widths (Adam-style optimizers)


class Position(StrEnum):
    """How the model knows where a token is (models/gpt.py, models/rope.py)."""

    learned = "learned"  # GPT-2: a learned embedding per position, added to the token's
    rope = "rope"  # rotary: every block turns queries and keys by their position (RoFormer, Llama); no parameters


class RopeFrequencies(StrEnum):
    """Which frequencies rotary positions turn a head's pairs of dimensions by (models/rope.py)."""

    standard = "standard"  # every pair i of H/2 at theta^(-2i / H) (RoFormer, Llama)
    half_truncated = "half_truncated"  # the speedrun's: H/4 pairs at (1/theta)^linspace(0, 1, H/4), H/4 not turned


class SoftcapForm(StrEnum):
    """How model.logit_softcap = c bounds the logits (models/lm_head.py)."""

    tanh = "tanh"  # c tanh(x / c) (Gemma 2; the speedrun's)
    algebraic = "algebraic"  # c x / sqrt(x^2 + c^2) (the speedrun's optimization track)
    sigmoid = "sigmoid"  # c sigmoid((x + 5) / 7.5), in (0, c) (the speedrun's record, c = 23)


class Norm(StrEnum):
    """The normalisation before attention, the MLP and the head (models/norms.py)."""

    layernorm = "layernorm"  # GPT-2: subtract the mean, divide by the standard deviation; a bias with model.bias
    rmsnorm = "rmsnorm"  # Llama: divide by the root mean square; no bias


class Mlp(StrEnum):
    """The MLP's nonlinearity (models/mlp.py)."""

    gelu = "gelu"  # GPT-2: GELU (tanh approximation); default width 4 x n_embd
    swiglu = "swiglu"  # Llama: SiLU(x W_gate) * (x W_up); default width 8/3 x n_embd (the parameters of 4x)
    relu2 = "relu2"  # ReLU(x W)^2 (Primer; the modded-nanogpt speedrun); default width 4 x n_embd


@dataclass(frozen=True)
class ModelOptions:
    """Every option of the network; each default is GPT-2's (gpt2-mini's shape)."""

    n_layer: int = 6  # transformer blocks
    n_head: int = 6  # attention heads per block; divides n_embd
    n_embd: int = 384  # width of the residual stream
    context_size: int = 256  # the longest window the model reads (learned positions: those with an embedding)
    dropout: float = 0.0  # dropout on embeddings, attention and MLP outputs; 0 = off
    bias: bool = True  # biases in the linear layers and LayerNorms (RMSNorm has none)
    vocab_multiple: int = 64  # the embedding's rows are padded to a multiple of this (faster matmuls, sharding)
    attention: Attention = Attention.auto  # attention kernel
    # sliding-window attention: each query sees itself and the attention_window - 1 positions before it (the
    # speedrun's short windows, Mistral's sliding window); null = every earlier position
    attention_window: Optional[int] = None
    # YaRN (Peng et al. 2023, arXiv:2309.00071; the GPT-2 speedrun's form): the attention windows the model trained
    # at before attention_window, oldest first. With rotary positions each growth rescales the rotary frequencies (a
    # pair that turns less than once over the old window slows by old / new, one that turns 32 times or more keeps
    # its speed, those between blend) and multiplies the attention scores by 1 + 0.2 ln(new / old). train.stages with
    # train.yarn=true fills it; [] = none
    yarn_windows: list[int] = field(default_factory=list)
    remat: Remat = Remat.none  # rematerialisation: memory for compute in the backward pass
    # the blocks under lax.scan (true: one block compiled, compile time independent of depth) or unrolled (false);
    # null: unrolled on a GPU (gpt2 on an H200: 1.30-1.35x the tokens/s, less memory), scanned elsewhere
    scan_layers: Optional[bool] = None
    head_loss: HeadLoss = HeadLoss.auto  # LM head + cross-entropy: all logits at once, or chunk by chunk
    # head_loss=chunked: tokens (batch rows x positions) whose logits exist at once; 32,768 (gpt2's batch of 32 x 1,024
    # in one chunk) measured faster than 8,192 on an H200 (359k against 343k tokens/s)
    head_loss_chunk: int = 32768
    logits_dtype: LogitsDtype = LogitsDtype.auto  # the head's logits: float32, or in the compute dtype
    # queries, keys and values from one product with the QKV weight, sliced for attention (true), or from three, one per
    # slice of the weight (false: no copies of the slices and of their gradient's concatenation; FP8 steps keep one)
    fused_qkv: bool = True
    # The modern decoders' options (models/gpt.py); each default is GPT-2's. conf/model/llama-*.yaml and
    # modern-gpt.yaml set them together.

    position: Position = Position.learned  # position information: a learned embedding (GPT-2) or rotary (rope)
    rope_theta: float = 10000.0  # position=rope: base of the rotary frequencies (Llama 2: 10000; Llama 3: 500000)
    rope_frequencies: RopeFrequencies = RopeFrequencies.standard  # position=rope: all pairs, or the speedrun's half
    norm: Norm = Norm.layernorm  # the norm before attention, MLP and head
    norm_weight: bool = True  # a learned per-channel scale in every norm; false: none (the speedrun's RMSNorm)
    mlp: Mlp = Mlp.gelu  # the MLP's nonlinearity
    # the MLP's hidden width; null = 4 x n_embd (gelu, relu2), 8/3 x n_embd rounded up to a multiple of 64 (swiglu)
    mlp_hidden: Optional[int] = None
    # key/value heads: null = n_head (multi-head attention); fewer, dividing n_head, = grouped-query attention
    # (each serves n_head / n_kv_head query heads; a smaller KV cache); 1 = multi-query attention
    n_kv_head: Optional[int] = None
    qk_norm: bool = False  # normalise queries and keys per head (with model.norm) before attention: QK-norm
    # QK-norm's learned per-channel weight; null: as model.norm_weight (false: none, the optimization track's)
    qk_norm_weight: Optional[bool] = None
    # attention scores scaled by this instead of 1 / sqrt(head size) (the optimization track's 0.12); null: 1/sqrt
    attention_scale: Optional[float] = None
    tie_embeddings: bool = True  # the LM head is the token embedding (GPT-2); false: a head matrix of its own
    head_bias: bool = False  # the LM head adds a learned bias per vocabulary entry (the optimization track's)
    # the embeddings (token, plus position when learned) normalised with model.norm before the first block (the
    # optimization track's)
    embedding_norm: bool = False
    logit_softcap: float = 0.0  # logits -> c tanh(logits / c), c this value (Gemma 2; the speedrun's 30); 0 = off
    logit_softcap_form: SoftcapForm = SoftcapForm.tanh  # logit_softcap's curve: tanh, algebraic or sigmoid
    # The modded-nanogpt speedrun's pieces (models/gpt.py); each default leaves the model as it was.

    # U-net skips: the last n_layer // 2 blocks' inputs add a learned weight (starting at 1) times the output of the
    # first half's blocks, mirrored (the last block gets the first block's); the weights are labelled `scalar`
    unet_skips: bool = False
    zero_init_mlp_out: bool = False  # the MLP's output projections start at zero: each block starts as attention alone
    # value embeddings: k tables [vocab, n_embd]; the first k blocks and the last k (tables 0..k-1 in both) add their
    # table's row of each token to the attention values, gated per key/value head by 2 sigmoid(w . x[:12]) of the
    # block's normed input (w starting at 0: a gate of 1); the tables are labelled `value_embedding`; 0 = off
    value_embeddings: int = 0
    # the smear gate: each token's embedding adds lambda sigmoid(w . x[:12]) times the previous token's (one token of
    # look-back; never across a document's start); lambda and w start at 0, labelled `scalar`
    smear_gate: bool = False
    # mup: hidden init std and Adam lr / m, scores / head_dim, readout / m, m = n_embd / mup_base_width (models/mup.py)
    parametrization: Parametrization = Parametrization.standard
    # parametrization=mup: the width that trains exactly as standard, with this model's heads (gpt2-micro's, 4 heads)
    mup_base_width: int = 256


@dataclass(frozen=True)
class GPTConfig(ModelOptions):
    """The model's static description (hashable: it lives inside the jitted pytree): the options of models/config.py
    with the vocabulary's size, and the attention kernel resolved (never `auto`)."""

    vocab_size: int = field(kw_only=True)
    attention: Attention = Attention.xla  # xla | cudnn | blocked (models/attention.py)
    yarn_windows: tuple[int, ...] = ()  # model.yarn_windows, as a tuple (hashable)

    @property
    def yarn_path(self) -> tuple[int, ...]:
        """The attention windows YaRN stretched the rotary positions through, the current one last (models/rope.py);
        () without YaRN."""
        return (*self.yarn_windows, self.attention_window) if self.yarn_windows and self.attention_window else ()

    @property
    def width_multiplier(self) -> float:
        """μP's m = n_embd / mup_base_width (models/mup.py); 1 under standard parametrization."""
        return self.n_embd / self.mup_base_width if self.parametrization == "mup" else 1.0

    @property
    def padded_vocab_size(self) -> int:
        """Vocab rounded up so the head's matmul has friendly shapes; padded ids are never predicted."""
        return math.ceil(self.vocab_size / self.vocab_multiple) * self.vocab_multiple

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def mlp_width(self) -> int:
        return mlp_hidden_width(self.mlp, self.n_embd, self.mlp_hidden)
