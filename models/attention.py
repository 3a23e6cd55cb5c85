"""Causal self-attention implementations behind `model.attention`.

  xla      jax.nn.dot_product_attention's XLA path: the full [T, T] score matrix, masked.
  cudnn    jax.nn.dot_product_attention's cuDNN fused (flash) kernel: NVIDIA GPUs, 16-bit inputs.
  blocked  the same maths in plain JAX, by query blocks: block i only scores keys [0, (i+1) * block), so about
           half of the masked work is never done and each block's scores fit in cache. Faster on CPU.

All take queries [B, T, N, H] and keys and values [B, T, K, H] and return [B, T, N, H]; they agree to float
rounding. K < N is grouped-query attention: query head n attends with key/value head n // (N / K), the pairing of
jax.nn.dot_product_attention (which takes such shapes itself) and of transformers' `repeat_kv`; `blocked` repeats
the keys and values to N heads first. With `segment_ids_BT` (document masking), a
query also sees only keys of its own segment: a [B, T, T] mask for jax.nn.dot_product_attention (XLA's and cuDNN's
paths), and the same test inside each block of `blocked`. With a `window` of W (sliding-window attention, the
speedrun's short windows), a query sees itself and the W - 1 positions before it: jax.nn.dot_product_attention's
`local_window_size` (cuDNN's sliding window), and in `blocked` each query block scores only the keys its window
reaches, so the work grows with W, not T. Decoding with a KV cache
(`cached_attention`: new tokens at each row's own position, over the cached keys) uses the configured backend where it
takes those shapes: one new token per row is a key-length mask, which cuDNN's kernel accepts (16-bit inputs); other
cases run XLA's.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from models.matmul import transposed

ATTENTION_BLOCK = 128  # query/key block for `blocked`; T must be a multiple (else it falls back to one block)


def causal_attention(
    q_BTNH: jax.Array,
    k_BTNH: jax.Array,
    v_BTNH: jax.Array,
    implementation: str,
    segment_ids_BT: jax.Array | None = None,
    window: int | None = None,
) -> jax.Array:
    dtype = q_BTNH.dtype
    q_BTNH, k_BTNH, v_BTNH = cpu_float16_to_float32(q_BTNH, k_BTNH, v_BTNH)
    if implementation == "cudnn" and dtype == jnp.float32:
        implementation = "xla"  # cuDNN's kernel takes 16-bit inputs: a float32 copy (sampling) runs XLA's
    if implementation == "blocked":
        groups = q_BTNH.shape[2] // k_BTNH.shape[2]
        if groups > 1:  # grouped-query: each key/value head serves `groups` consecutive query heads
            k_BTNH, v_BTNH = jnp.repeat(k_BTNH, groups, axis=2), jnp.repeat(v_BTNH, groups, axis=2)
        y_BTNH = blocked_causal_attention(q_BTNH, k_BTNH, v_BTNH, ATTENTION_BLOCK, segment_ids_BT, window)
    else:
        same_B1TT = None if segment_ids_BT is None else same_segment(segment_ids_BT, segment_ids_BT)[:, None]
        y_BTNH = jax.nn.dot_product_attention(
            q_BTNH,
            k_BTNH,
            v_BTNH,
            mask=same_B1TT,
            is_causal=True,
            local_window_size=None if window is None else (window - 1, 0),
            implementation=implementation,
        )
    return y_BTNH.astype(dtype)


def cached_attention(
    q_BTNH: jax.Array,
    k_BCNH: jax.Array,
    v_BCNH: jax.Array,
    start_B: jax.Array,
    implementation: str,
    window: int | None = None,
) -> jax.Array:
    """Attention of T new tokens per row, at positions start_B .. start_B + T - 1, to the C cached positions: each
    sees the positions up to its own (the cache holds the new tokens' keys and values already), the last `window`
    of them with a window."""
    dtype = q_BTNH.dtype
    q_BTNH, k_BCNH, v_BCNH = cpu_float16_to_float32(q_BTNH, k_BCNH, v_BCNH)
    T, C = q_BTNH.shape[1], k_BCNH.shape[1]
    if T == 1 and window is None:  # one token per row: it sees the first start + 1 positions, a key-length mask
        # implementation=None lets JAX take cuDNN's kernel when it accepts the shapes and dtype, else XLA's.
        use = None if implementation == "cudnn" else "xla"
        y_BTNH = jax.nn.dot_product_attention(
            q_BTNH, k_BCNH, v_BCNH, key_value_seq_lengths=start_B + 1, implementation=use
        )
    else:
        position_BT1 = (start_B[:, None] + jnp.arange(T))[:, :, None]
        visible_BTC = jnp.arange(C)[None, None, :] <= position_BT1
        if window is not None:
            visible_BTC = visible_BTC & (jnp.arange(C)[None, None, :] > position_BT1 - window)
        y_BTNH = jax.nn.dot_product_attention(q_BTNH, k_BCNH, v_BCNH, mask=visible_BTC[:, None], implementation="xla")
    return y_BTNH.astype(dtype)


def same_segment(q_segments_BT: jax.Array, k_segments_BS: jax.Array) -> jax.Array:
    """[B, T, S]: True where query t and key s belong to the same document."""
    return q_segments_BT[:, :, None] == k_segments_BS[:, None, :]


def blocked_causal_attention(
    q_BTNH: jax.Array,
    k_BTNH: jax.Array,
    v_BTNH: jax.Array,
    block: int,
    segment_ids_BT: jax.Array | None = None,
    window: int | None = None,
) -> jax.Array:
    T = q_BTNH.shape[1]
    if T % block or T <= block:
        block = T
    scale = 1.0 / math.sqrt(q_BTNH.shape[-1])
    outputs = []
    for start in range(0, T, block):
        end = start + block
        first = 0 if window is None else max(0, start - window + 1)  # the earliest key this block's queries see
        q_BNtH = jnp.swapaxes(q_BTNH[:, start:end], 1, 2) * jnp.asarray(scale, q_BTNH.dtype)
        k_BNsH = jnp.swapaxes(k_BTNH[:, first:end], 1, 2)
        v_BNsH = jnp.swapaxes(v_BTNH[:, first:end], 1, 2)
        query_t1, key_1s = jnp.arange(start, end)[:, None], jnp.arange(first, end)[None, :]
        visible_1ts = (query_t1 >= key_1s)[None]
        if window is not None:
            visible_1ts = visible_1ts & (query_t1 - key_1s < window)[None]
        if segment_ids_BT is not None:
            visible_1ts = visible_1ts & same_segment(segment_ids_BT[:, start:end], segment_ids_BT[:, first:end])
        outputs.append(jnp.swapaxes(block_attention(q_BNtH, k_BNsH, v_BNsH, visible_1ts[:, None]), 1, 2))
    return jnp.concatenate(outputs, axis=1)


@jax.custom_vjp
def block_attention(q_BNtH: jax.Array, k_BNsH: jax.Array, v_BNsH: jax.Array, visible_bnts: jax.Array) -> jax.Array:
    """One query block's attention over its keys: softmax of the (already scaled) scores where `visible`, times the
    values; [B, N, t, H]. Its backward pass is written out (`_block_backward`) so that every matmul in it has the
    operand layouts XLA:CPU's fast dot path (YNNPACK) takes; differentiated automatically, three of its four dots
    contract a [t, s] or [t, H] operand over its leading axis, which XLA:CPU runs through its generic dot at a quarter
    of the speed. Forward-over-reverse (Hessian-vector products) differentiates through it; forward mode alone does
    not (a `custom_vjp`)."""
    return _block_forward(q_BNtH, k_BNsH, v_BNsH, visible_bnts)[0]


def _block_forward(q_BNtH, k_BNsH, v_BNsH, visible_bnts):
    s_BNts = jnp.einsum("bnth,bnsh->bnts", q_BNtH, k_BNsH, preferred_element_type=jnp.float32)
    p_BNts = jax.nn.softmax(jnp.where(visible_bnts, s_BNts, -jnp.inf), axis=-1)  # float32
    return jnp.einsum("bnts,bnsh->bnth", p_BNts.astype(v_BNsH.dtype), v_BNsH), (q_BNtH, k_BNsH, v_BNsH, p_BNts)


def _block_backward(residuals, do_BNtH):
    """dS = P * (dP - rowsum(dP * P)) with dP = dO V^T; dQ = dS K; dK and dV as their transposes, dK^T = Q^T dS and
    dV^T = dO^T P, from Q and dO transposed first (their [t, H] copies are small; P's and dS's [t, s] would not be)."""
    q_BNtH, k_BNsH, v_BNsH, p_BNts = residuals
    dp_BNts = jnp.einsum("bnth,bnsh->bnts", do_BNtH, v_BNsH, preferred_element_type=jnp.float32)
    ds_BNts = p_BNts * (dp_BNts - jnp.sum(dp_BNts * p_BNts, axis=-1, keepdims=True))
    # dS stays float32 in its two matmuls (as JAX's own differentiation of the scores' float32 matmul has it)
    dq_BNtH = jnp.einsum("bnts,bnsh->bnth", ds_BNts, k_BNsH.astype(jnp.float32))
    dkT_BNHs = jnp.einsum("bnht,bnts->bnhs", transposed(q_BNtH, 2, 3).astype(jnp.float32), ds_BNts)
    dvT_BNHs = jnp.einsum(
        "bnht,bnts->bnhs", transposed(do_BNtH, 2, 3), p_BNts.astype(do_BNtH.dtype), preferred_element_type=jnp.float32
    )
    return (
        dq_BNtH.astype(q_BNtH.dtype),
        jnp.swapaxes(dkT_BNHs, 2, 3).astype(k_BNsH.dtype),
        jnp.swapaxes(dvT_BNHs, 2, 3).astype(v_BNsH.dtype),
        None,  # the mask
    )


block_attention.defvjp(_block_forward, _block_backward)


def cpu_float16_to_float32(*xs: jax.Array) -> tuple[jax.Array, ...]:
    """XLA:CPU has no float16 x float16 -> float32 matmul: there, float16 operands of float32-accumulating matmuls
    (attention scores, the LM head) are widened first. Other backends keep float16."""
    if xs[0].dtype == jnp.float16 and jax.default_backend() == "cpu":
        return tuple(x.astype(jnp.float32) for x in xs)
    return xs
