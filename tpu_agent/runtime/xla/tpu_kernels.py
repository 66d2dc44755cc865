"""TorchTPU's fused kernels as the TPU estimate compiles them: memory linear in the sequence, the math's FLOPs.

The emulated device records ``F.scaled_dot_product_attention`` as the CPU's fused flash op and its backward
(``_scaled_dot_product_flash_attention_for_cpu``, see :mod:`tpu_agent.runtime.emulated.attention`). Its CPU
lowering (:mod:`.extra_ops`) writes the whole (L, S) score matrix, which is right for numerics on a CPU and
wrong for a TPU estimate: TorchTPU runs SDPA through its own fused kernel choice (its ``_fused_sdp_choice``, a
custom kernel for bf16, and ``torch.tpu.ops.splash_sdpa`` with 512 x 512 tiles for large models), which never
holds more than a tile of scores. A 7B step at 8192 tokens needed terabytes of "temporaries" that no TPU run
allocates.

Inside :func:`as_on_tpu` the two ops lower to the flash algorithm written in plain JAX: an outer loop over
query blocks, an inner loop over key/value blocks with an online softmax (forward) or the logsumexp the forward
saved (backward, which recomputes the scores as flash kernels do). XLA compiles the loops without the (L, S)
buffer, and partitions them over a sharded batch like any other op (a Pallas kernel would be a custom call the
partitioner replicates). FLOPs are those of the math form, causal masking included (a kernel that skips fully
masked blocks does about half of a causal score matrix's work; the estimate does not assume it). The compiler's
cost analysis counts a loop body once, so each kernel notes the FLOPs of its other tiles (:class:`KernelUse`),
which the estimate adds.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

BLOCK = 512  # query and key/value rows per tile: splash_sdpa's default block_q and block_kv
FLASH_ATTENTION = "scaled_dot_product_attention: blockwise flash kernel (memory linear in the sequence)"


@dataclass
class KernelUse:
    """What a trace lowered as TorchTPU's kernels: their descriptions, and the FLOPs (over the whole, unsharded
    program) of every tile after the first, which the compiler's cost analysis does not count."""

    kernels: set[str] = field(default_factory=set)
    uncounted_flops: float = 0.0


class _Kernels(threading.local):
    use: KernelUse | None = None


_kernels = _Kernels()


@contextlib.contextmanager
def as_on_tpu() -> Iterator[KernelUse]:
    """Lower the ops in this module as TorchTPU runs them on a TPU (for a TPU compile, never for execution on
    the CPU); yields the :class:`KernelUse` the trace fills as it goes."""
    previous = _kernels.use
    _kernels.use = KernelUse()
    try:
        yield _kernels.use
    finally:
        _kernels.use = previous


def active() -> bool:
    """Whether the trace in progress lowers for a TPU target (see :func:`as_on_tpu`)."""
    return _kernels.use is not None


def _note(kernel: str, flops: float, tiles: int) -> None:
    """Record a kernel of ``flops`` in ``tiles`` tile pairs, one of which the compiler counts."""
    if _kernels.use is not None:
        _kernels.use.kernels.add(kernel)
        _kernels.use.uncounted_flops += flops * (1 - 1 / tiles)


def block_size(length: int, block: int = BLOCK) -> int:
    """The tile edge along a sequence of ``length``: ``block`` or a smaller power of two dividing it, else the
    whole length (one tile)."""
    size = block
    while size >= 8:
        if length % size == 0:
            return size
        size //= 2
    return length


def _grouped(x: jax.Array, kv_heads: int) -> jax.Array:
    """(B, H, L, E) -> (B, Hkv, G, L, E): query heads grouped under the key/value head they share (GQA)."""
    batch, heads, length, width = x.shape
    return x.reshape(batch, kv_heads, heads // kv_heads, length, width)


def _mask_block(mask: jax.Array | None, kv_heads: int, q0: jax.Array, k0: jax.Array, bq: int, bk: int) -> jax.Array:
    """The (bq, bk) tile of an additive mask broadcastable to (B, H, L, S), shaped to add to grouped scores.

    A dimension the mask broadcasts (size 1: a ``(B, 1, 1, S)`` padding mask's rows) is kept whole, not sliced."""
    assert mask is not None and mask.ndim == 4  # the callers' _as4d
    rows = jax.lax.dynamic_slice_in_dim(mask, q0, bq, axis=-2) if mask.shape[-2] > 1 else mask
    tile = jax.lax.dynamic_slice_in_dim(rows, k0, bk, axis=-1) if mask.shape[-1] > 1 else rows
    if tile.shape[1] == 1:
        return tile[:, :, None]
    return _grouped(tile, kv_heads)


def _scores(
    q: jax.Array,
    k: jax.Array,
    mask: jax.Array | None,
    is_causal: bool,
    scale: float,
    q0: jax.Array,
    k0: jax.Array,
) -> jax.Array:
    """One (bq, bk) tile of masked scores in f32, from tiles in the inputs' dtype (the MXU's bf16 x bf16 -> f32)."""
    scores = jnp.einsum("bkgle,bkse->bkgls", q, k, preferred_element_type=jnp.float32) * scale
    if mask is not None:
        scores = jnp.where(mask, scores, -jnp.inf) if mask.dtype == jnp.bool_ else scores + mask.astype(jnp.float32)
    if is_causal:
        rows = q0 + jnp.arange(q.shape[-2])[:, None]
        cols = k0 + jnp.arange(k.shape[-2])[None, :]
        scores = jnp.where(cols <= rows, scores, -jnp.inf)
    return scores


def _as4d(mask: jax.Array | None) -> jax.Array | None:
    return None if mask is None else mask.reshape((1,) * (4 - mask.ndim) + mask.shape)


def flash_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    is_causal: bool,
    attn_mask: jax.Array | None,
    scale: float | None,
    block: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``(output, logsumexp)`` of SDPA over (B, H, L, E) queries and (B, Hkv, S, E) keys and values."""
    batch, heads, length, width = query.shape
    kv_heads, source = key.shape[1], key.shape[2]
    factor = scale if scale is not None else 1.0 / float(width) ** 0.5
    bq, bk = block_size(length, block or BLOCK), block_size(source, block or BLOCK)
    _note(FLASH_ATTENTION, 2 * 2.0 * batch * heads * length * source * width, (length // bq) * (source // bk))
    q = _grouped(query, kv_heads).reshape(batch, kv_heads, heads // kv_heads, length // bq, bq, width)
    mask = _as4d(attn_mask)

    def one_query_block(index: jax.Array) -> tuple[jax.Array, jax.Array]:
        q_tile = jax.lax.dynamic_index_in_dim(q, index, axis=3, keepdims=False)
        q0 = index * bq

        def one_key_block(carry: tuple[jax.Array, ...], j: jax.Array) -> tuple[tuple[jax.Array, ...], None]:
            out, running_max, total = carry
            k0 = j * bk
            k_tile = jax.lax.dynamic_slice_in_dim(key, k0, bk, axis=2)
            v_tile = jax.lax.dynamic_slice_in_dim(value, k0, bk, axis=2)
            tile_mask = None if mask is None else _mask_block(mask, kv_heads, q0, k0, bq, bk)
            scores = _scores(q_tile, k_tile, tile_mask, is_causal, factor, q0, k0)
            new_max = jnp.maximum(running_max, scores.max(axis=-1))
            safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
            probabilities = jnp.exp(scores - safe_max[..., None])
            correction = jnp.exp(running_max - safe_max)
            total = total * correction + probabilities.sum(axis=-1)
            out = out * correction[..., None] + jnp.einsum(
                "bkgls,bkse->bkgle", probabilities.astype(value.dtype), v_tile, preferred_element_type=jnp.float32
            )
            return (out, new_max, total), None

        rows = q_tile.shape[:-1]
        start = (jnp.zeros((*rows, width), jnp.float32), jnp.full(rows, -jnp.inf), jnp.zeros(rows, jnp.float32))
        (out, running_max, total), _ = jax.lax.scan(one_key_block, start, jnp.arange(source // bk))
        seen = total > 0
        logsumexp = jnp.where(seen, running_max + jnp.log(jnp.where(seen, total, 1.0)), -jnp.inf)
        return out / jnp.where(seen, total, 1.0)[..., None], logsumexp

    out, logsumexp = jax.lax.map(one_query_block, jnp.arange(length // bq))
    # (nq, B, Hkv, G, bq, ...) -> (B, H, L, ...)
    out = jnp.moveaxis(out, 0, 3).reshape(batch, heads, length, width)
    logsumexp = jnp.moveaxis(logsumexp, 0, 3).reshape(batch, heads, length)
    return out.astype(query.dtype), logsumexp


def flash_attention_backward(
    grad_out: jax.Array,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    out: jax.Array,
    logsumexp: jax.Array,
    is_causal: bool,
    attn_mask: jax.Array | None,
    scale: float | None,
    block: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(grad_query, grad_key, grad_value)``: scores recomputed tile by tile from the saved logsumexp."""
    batch, heads, length, width = query.shape
    kv_heads, source = key.shape[1], key.shape[2]
    factor = scale if scale is not None else 1.0 / float(width) ** 0.5
    bq, bk = block_size(length, block or BLOCK), block_size(source, block or BLOCK)
    nq = length // bq
    # five matmuls a tile: the scores again, dV, dP, dQ, dK
    _note(FLASH_ATTENTION, 5 * 2.0 * batch * heads * length * source * width, nq * (source // bk))

    def tiles(x: jax.Array) -> jax.Array:
        return _grouped(x, kv_heads).reshape(batch, kv_heads, heads // kv_heads, nq, bq, *x.shape[3:])

    q, g = tiles(query), tiles(grad_out)
    lse = tiles(logsumexp[..., None].astype(jnp.float32))[..., 0]
    row_dot = tiles(jnp.sum(grad_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True))[..., 0]
    mask = _as4d(attn_mask)

    def one_query_block(
        carry: tuple[jax.Array, jax.Array], index: jax.Array
    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        def pick(x: jax.Array) -> jax.Array:
            return jax.lax.dynamic_index_in_dim(x, index, axis=3, keepdims=False)

        q_tile, g_tile, lse_tile, d_tile = pick(q), pick(g), pick(lse), pick(row_dot)
        finite = jnp.isfinite(lse_tile)
        lse_safe = jnp.where(finite, lse_tile, 0.0)
        q0 = index * bq

        def one_key_block(inner: tuple[jax.Array, ...], j: jax.Array) -> tuple[tuple[jax.Array, ...], None]:
            grad_q, grad_k, grad_v = inner
            k0 = j * bk
            k_tile = jax.lax.dynamic_slice_in_dim(key, k0, bk, axis=2)
            v_tile = jax.lax.dynamic_slice_in_dim(value, k0, bk, axis=2)
            tile_mask = None if mask is None else _mask_block(mask, kv_heads, q0, k0, bq, bk)
            scores = _scores(q_tile, k_tile, tile_mask, is_causal, factor, q0, k0)
            probabilities = jnp.where(finite[..., None], jnp.exp(scores - lse_safe[..., None]), 0.0)
            grad_v_tile = jnp.einsum(
                "bkgls,bkgle->bkse", probabilities.astype(value.dtype), g_tile, preferred_element_type=jnp.float32
            )
            grad_p = jnp.einsum("bkgle,bkse->bkgls", g_tile, v_tile, preferred_element_type=jnp.float32)
            grad_s = (probabilities * (grad_p - d_tile[..., None]) * factor).astype(query.dtype)
            grad_q = grad_q + jnp.einsum("bkgls,bkse->bkgle", grad_s, k_tile, preferred_element_type=jnp.float32)
            grad_k_tile = jnp.einsum("bkgls,bkgle->bkse", grad_s, q_tile, preferred_element_type=jnp.float32)
            grad_k = jax.lax.dynamic_update_slice_in_dim(
                grad_k, jax.lax.dynamic_slice_in_dim(grad_k, k0, bk, axis=2) + grad_k_tile, k0, axis=2
            )
            grad_v = jax.lax.dynamic_update_slice_in_dim(
                grad_v, jax.lax.dynamic_slice_in_dim(grad_v, k0, bk, axis=2) + grad_v_tile, k0, axis=2
            )
            return (grad_q, grad_k, grad_v), None

        grad_k, grad_v = carry
        start = (jnp.zeros(q_tile.shape, jnp.float32), grad_k, grad_v)
        (grad_q, grad_k, grad_v), _ = jax.lax.scan(one_key_block, start, jnp.arange(source // bk))
        return (grad_k, grad_v), grad_q

    zeros = jnp.zeros(key.shape, jnp.float32)
    (grad_k, grad_v), grad_q = jax.lax.scan(one_query_block, (zeros, zeros), jnp.arange(nq))
    grad_q = jnp.moveaxis(grad_q, 0, 3).reshape(query.shape)
    return grad_q.astype(query.dtype), grad_k.astype(key.dtype), grad_v.astype(value.dtype)
