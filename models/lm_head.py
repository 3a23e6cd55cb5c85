"""The LM head and the loss's two terms per token: log Z (the softmax's normaliser over the vocabulary) and the
target's logit. The cross-entropy is log Z - target logit; z-loss is (log Z)^2. Both are float32.

  dense    the float32 logits [B, T, V] in one matmul, then log-sum-exp and the target's logit. Autodiff keeps the
           [B, T, V] logits for the backward pass; with 16-bit operands their gradient is rounded to the operands'
           dtype before the head's two gradient matmuls (a custom VJP), as in the chunked head.
  chunked  the same numbers, `chunk_tokens` tokens at a time: each chunk's logits are made, reduced to log Z and the
           target logit, and dropped; the backward pass (a custom VJP) makes them again chunk by chunk, turns them into
           the logits' gradient softmax * dlog_z + onehot * dtarget, and feeds it straight to the two matmuls of the
           head's gradient. No [B, T, V] array exists in either pass: memory is one chunk's [b, t, V] float32.
           Costs one more head matmul (the recomputation) per step.

The head's matmul accumulates in float32 and writes its logits in float32, or with `model.logits_dtype=compute`
(auto's choice on a GPU) at 16-bit compute in the compute dtype (nanoGPT's bfloat16 logits under autocast): what
reads them (log Z, the softmax and its gradient) converts as it reads, in float32, so each pass over [B, T, V] moves
half the bytes.

With a soft-cap c > 0 (`model.logit_softcap`; Gemma 2, the modded-nanogpt speedrun) every logit is c tanh(logit / c)
(or, `model.logit_softcap_form=algebraic`, c logit / sqrt(logit^2 + c^2), the speedrun's optimization track; or
`sigmoid`, c sigmoid((logit + 5) / 7.5), the speedrun's record) before anything reads it, in both heads; the chunked
backward pass multiplies the logits' gradient by the cap's derivative, from the capped value y: 1 - (y / c)^2, its
3/2 power for the algebraic form, y (1 - y / c) / 7.5 for the sigmoid.

Padded vocabulary rows (ids >= vocab_size, GPTConfig.padded_vocab_size) get a logit of -1e9 inside the same fused
computation that reads the logits, so they never receive probability and no extra pass over [B, T, V] is made.
Chunks split the time axis only, so a batch sharded over the mesh's `data` axis stays sharded in every chunk.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from models.attention import cpu_float16_to_float32

PADDED_LOGIT = -1e9  # the logit of a padded vocabulary row: exp(PADDED_LOGIT - log Z) is 0 in float32


# The speedrun's sigmoid cap, c sigmoid((x + SHIFT) / SCALE): constants tuned there (with c = 23), kept for every c.
SIGMOID_SHIFT, SIGMOID_SCALE = 5.0, 7.5


def soft_cap(x: jax.Array, c: float, form: str) -> jax.Array:
    """x bounded to (-c, c): c tanh(x / c), or c x / sqrt(x^2 + c^2) (`algebraic`); or to (0, c): c sigmoid((x + 5)
    / 7.5) (`sigmoid`; softmax reads only differences, so the shift to positive values changes nothing)."""
    if form == "algebraic":
        return c * x * jax.lax.rsqrt(x * x + c * c)
    if form == "sigmoid":
        return c * jax.nn.sigmoid((x + SIGMOID_SHIFT) / SIGMOID_SCALE)
    return c * jnp.tanh(x / c)


def soft_cap_slope(y: jax.Array, c: float, form: str) -> jax.Array:
    """The cap's derivative at x, from its value y = soft_cap(x): 1 - (y / c)^2, its 3/2 power when algebraic, y (1
    - y / c) / 7.5 for the sigmoid (0 at a padded row's PADDED_LOGIT, which no cap gives)."""
    if form == "sigmoid":
        return jnp.maximum(y * (1.0 - y / c), 0.0) / SIGMOID_SCALE
    s = jnp.maximum(1.0 - jnp.square(y / c), 0.0)
    return s * jnp.sqrt(s) if form == "algebraic" else s


def masked_logits(
    h_BTD: jax.Array,
    w_VD: jax.Array,
    vocab_size: int,
    softcap: float = 0.0,
    form: str = "tanh",
    b_V: jax.Array | None = None,
    logits_dtype: str = "float32",
) -> jax.Array:
    """Float32 logits [B, T, V] of the padded vocabulary (plus the head's bias `b_V` when it has one; soft-capped
    when `softcap` > 0, by `form`), padded rows at PADDED_LOGIT. With `logits_dtype="compute"` and 16-bit operands the
    matmul writes them in the operands' dtype (accumulated in float32) and what reads them converts as it reads."""
    h_BTD, w_VD = cpu_float16_to_float32(h_BTD, w_VD)
    if h_BTD.dtype == jnp.float32:
        logits_BTV = _logits(h_BTD, w_VD)
    else:
        out = h_BTD.dtype if logits_dtype == "compute" else jnp.float32
        logits_BTV = _head_matmul(h_BTD, w_VD, jnp.dtype(out)).astype(jnp.float32)
    if b_V is not None:
        logits_BTV = logits_BTV + b_V.astype(jnp.float32)
    if softcap:
        logits_BTV = soft_cap(logits_BTV, softcap, form)
    is_real = jnp.arange(w_VD.shape[0]) < vocab_size
    return jnp.where(is_real, logits_BTV, PADDED_LOGIT)


def _logits(h_BTD: jax.Array, w_VD: jax.Array, out=jnp.float32) -> jax.Array:
    return jnp.einsum("btd,vd->btv", h_BTD, w_VD, preferred_element_type=out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _head_matmul(h_BTD: jax.Array, w_VD: jax.Array, out) -> jax.Array:
    """16-bit h W^T accumulated in float32, written as `out` (float32, or the operands' dtype); its backward pass
    multiplies the logits' gradient rounded to the operands' dtype, as the chunked head does. Autodiff would keep a
    float32 gradient float32 and run both gradient matmuls in float32 (TF32 on a GPU: half the 16-bit rate, on twice
    the bytes): measured on an H200 with gpt2 at batch 32, those two matmuls took 15 of the step's 103 ms."""
    return _logits(h_BTD, w_VD, out)


def _head_matmul_fwd(h_BTD, w_VD, out):
    return _logits(h_BTD, w_VD, out), (h_BTD, w_VD)


def _head_matmul_bwd(out, residuals, d_logits_BTV):
    h_BTD, w_VD = residuals
    d_logits_BTV = d_logits_BTV.astype(h_BTD.dtype)
    dh_BTD = jnp.einsum("btv,vd->btd", d_logits_BTV, w_VD, preferred_element_type=jnp.float32)
    dw_VD = jnp.einsum("btv,btd->vd", d_logits_BTV, h_BTD, preferred_element_type=jnp.float32)
    return dh_BTD.astype(h_BTD.dtype), dw_VD.astype(w_VD.dtype)


_head_matmul.defvjp(_head_matmul_fwd, _head_matmul_bwd)


def log_z_and_target_logit(logits_BTV: jax.Array, targets_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits_BTV = logits_BTV.astype(jnp.float32)
    log_z_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
    target_logit_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
    return log_z_BT, target_logit_BT


def chunk_length(batch: int, time: int, chunk_tokens: int) -> int:
    """Positions per chunk: the largest divisor of `time` whose chunk of `batch` rows holds at most `chunk_tokens`
    tokens (at least 1 position)."""
    most = max(1, chunk_tokens // max(batch, 1))
    return max(t for t in range(1, time + 1) if time % t == 0 and t <= most)


def chunked_log_z_and_target_logit(
    h_BTD: jax.Array,
    w_VD: jax.Array,
    targets_BT: jax.Array,
    vocab_size: int,
    chunk_tokens: int,
    softcap: float = 0.0,
    form: str = "tanh",
    b_V: jax.Array | None = None,
    logits_dtype: str = "float32",
) -> tuple[jax.Array, jax.Array]:
    """log Z and the target's logit ([B, T] float32 each) without the [B, T, V] logits; equal to
    `log_z_and_target_logit(masked_logits(...), targets)` up to float rounding, and so are their gradients."""
    B, T = targets_BT.shape
    head = (float(softcap), str(form), str(logits_dtype))  # masked_logits' static arguments
    return _chunked(h_BTD, w_VD, b_V, targets_BT, vocab_size, chunk_length(B, T, chunk_tokens), head)


def _to_chunks(x: jax.Array, t: int) -> jax.Array:
    """[B, T, ...] -> [T / t, B, t, ...]: a leading axis to scan over; the batch axis (and its sharding) stays."""
    B, T = x.shape[:2]
    return jnp.moveaxis(x.reshape(B, T // t, t, *x.shape[2:]), 1, 0)


def _from_chunks(x: jax.Array) -> jax.Array:
    n, B, t = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape(B, n * t, *x.shape[3:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _chunked(h_BTD, w_VD, b_V, targets_BT, vocab_size, t, head):
    return _forward(h_BTD, w_VD, b_V, targets_BT, vocab_size, t, head)


def _logits_of(h_BtD, w_VD, b_V, vocab_size, head):
    softcap, form, logits_dtype = head
    return masked_logits(h_BtD, w_VD, vocab_size, softcap, form, b_V, logits_dtype)


def _forward(h_BTD, w_VD, b_V, targets_BT, vocab_size, t, head):
    def chunk(_, xs):
        h_BtD, targets_Bt = xs
        return None, log_z_and_target_logit(_logits_of(h_BtD, w_VD, b_V, vocab_size, head), targets_Bt)

    _, (log_z, target_logit) = jax.lax.scan(chunk, None, (_to_chunks(h_BTD, t), _to_chunks(targets_BT, t)))
    return _from_chunks(log_z), _from_chunks(target_logit)


def _chunked_fwd(h_BTD, w_VD, b_V, targets_BT, vocab_size, t, head):
    log_z_BT, target_logit_BT = _forward(h_BTD, w_VD, b_V, targets_BT, vocab_size, t, head)
    return (log_z_BT, target_logit_BT), (h_BTD, w_VD, b_V, targets_BT, log_z_BT)


def _chunked_bwd(vocab_size, t, head, residuals, cotangents):
    h_BTD, w_VD, b_V, targets_BT, log_z_BT = residuals
    d_log_z_BT, d_target_BT = cotangents
    V = w_VD.shape[0]
    h_op, w_op = cpu_float16_to_float32(h_BTD, w_VD)  # the matmuls' operand dtype: the compute dtype

    def chunk(carry, xs):
        dw_VD, db_V = carry
        h_BtD, targets_Bt, log_z_Bt, d_log_z_Bt, d_target_Bt = xs
        logits_BtV = _logits_of(h_BtD, w_VD, b_V, vocab_size, head)
        probs_BtV = jnp.exp(logits_BtV - log_z_Bt[..., None])
        is_target_BtV = jnp.arange(V) == targets_Bt[..., None]
        d_logits_BtV = d_log_z_Bt[..., None] * probs_BtV + jnp.where(is_target_BtV, d_target_Bt[..., None], 0.0)
        if head[0]:  # through the cap: its slope from the capped logits (padded rows' gradient is 0 already)
            d_logits_BtV = d_logits_BtV * soft_cap_slope(logits_BtV, head[0], head[1])
        if db_V is not None:  # the bias's gradient: the float32 logits' gradient summed over the chunk's tokens
            db_V = db_V + d_logits_BtV.sum((0, 1))
        d_logits_BtV = d_logits_BtV.astype(w_op.dtype)
        dh_BtD = jnp.einsum("btv,vd->btd", d_logits_BtV, w_op, preferred_element_type=jnp.float32)
        dw_VD = dw_VD + jnp.einsum(
            "btv,btd->vd", d_logits_BtV, h_BtD.astype(w_op.dtype), preferred_element_type=jnp.float32
        )
        return (dw_VD, db_V), dh_BtD.astype(h_BTD.dtype)

    xs = tuple(_to_chunks(x, t) for x in (h_op, targets_BT, log_z_BT, d_log_z_BT, d_target_BT))
    db0 = None if b_V is None else jnp.zeros(b_V.shape, jnp.float32)
    (dw_VD, db_V), dh = jax.lax.scan(chunk, (jnp.zeros(w_VD.shape, jnp.float32), db0), xs)
    return _from_chunks(dh), dw_VD.astype(w_VD.dtype), None if b_V is None else db_V.astype(b_V.dtype), None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)
