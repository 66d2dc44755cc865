"""Lowerings this project adds to torchax's op table, each for a graph shape torchax handles poorly or not at all.

* ``as_strided`` / ``as_strided_copy`` / ``as_strided_scatter``: DeferAndFuse graphs reach every input as a
  strided view of its storage buffer, and write mutated inputs back the same way. torchax lowers these to
  gathers and scatters over computed indices; when the view is a (possibly transposed, broadcast) dense block
  of the buffer, which is nearly always, a slice, reshape and transpose says the same thing and XLA turns it
  into a copy-free layout change.
* ``detach_copy`` / ``alias_copy``: what functionalisation makes of ``detach`` and ``alias``; plain copies.
* ``normal_functional``: what functionalisation makes of ``normal_`` (``torch.randn`` on the device); drawn
  from the executable's PRNG key like torchax's ``normal``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch

Block = tuple[list[int], list[int], int]  # (sizes of the dense block's axes, permutation, element count)


def _dense_block(sizes: Sequence[int], strides: Sequence[int]) -> Block | None:
    """How a strided view reads a dense block of its buffer: the block's axis sizes (outermost first), the
    transpose that brings them into the view's dim order, and the block's element count; None when the view
    is not a dense block (overlapping or gapped strides)."""
    dims = sorted(
        ((st, sz, i) for i, (sz, st) in enumerate(zip(sizes, strides, strict=True)) if sz != 1 and st != 0),
        key=lambda d: -d[0],
    )
    expected = 1
    for st, sz, _ in reversed(dims):
        if st != expected:
            return None
        expected *= sz
    order = [i for _, _, i in dims]
    permutation = sorted(range(len(order)), key=lambda k: order[k])
    return [sz for _, sz, _ in dims], permutation, expected


def as_strided(
    x: jax.Array, sizes: Sequence[int], strides: Sequence[int], storage_offset: int | None = None
) -> jax.Array | None:
    offset = storage_offset or 0
    block = _dense_block(sizes, strides)
    flat = jnp.ravel(x)
    if block is None or offset + block[2] > flat.shape[0]:
        return None
    axes, permutation, count = block
    dense = jnp.transpose(jax.lax.slice(flat, (offset,), (offset + count,)).reshape(axes), permutation)
    kept = {i for i, (sz, st) in enumerate(zip(sizes, strides, strict=True)) if sz != 1 and st != 0}
    shaped = dense.reshape([sizes[i] if i in kept else 1 for i in range(len(sizes))])
    return jnp.broadcast_to(shaped, tuple(sizes))


def as_strided_scatter(
    x: jax.Array, src: jax.Array, sizes: Sequence[int], strides: Sequence[int], storage_offset: int | None = None
) -> jax.Array | None:
    offset = storage_offset or 0
    block = _dense_block(sizes, strides)
    flat = jnp.ravel(x)
    if (
        block is None
        or any(st == 0 and sz != 1 for sz, st in zip(sizes, strides, strict=True))
        or offset + block[2] > flat.shape[0]
    ):
        return None
    axes, permutation, _ = block
    inverse = sorted(range(len(permutation)), key=lambda k: permutation[k])
    kept_shape = [axes[p] for p in permutation]
    dense = jnp.transpose(jnp.reshape(src, kept_shape), inverse).ravel().astype(flat.dtype)
    return jax.lax.dynamic_update_slice(flat, dense, (offset,)).reshape(x.shape)


def _or_torchax(fast: Callable[..., Any], general: Callable[..., Any]) -> Callable[..., Any]:
    def lowered(*args: Any, **kwargs: Any) -> Any:
        result = fast(*args, **kwargs)
        return general(*args, **kwargs) if result is None else result

    return lowered


def install(env: Any, operator_type: type) -> None:
    """Add or replace this module's lowerings in a torchax environment's op table."""
    aten = torch.ops.aten

    def put(op: Any, func: Callable[..., Any], needs_env: bool = False) -> None:
        env._ops[op] = operator_type(op, func, True, False, needs_env, False)

    def general(op: Any) -> Callable[..., Any]:
        return env._get_op_or_decomp(op).func

    put(aten.as_strided.default, _or_torchax(as_strided, general(aten.as_strided.default)))
    put(aten.as_strided_copy.default, _or_torchax(as_strided, general(aten.as_strided_copy.default)))
    put(aten.as_strided_scatter.default, _or_torchax(as_strided_scatter, general(aten.as_strided_scatter.default)))
    for op in (aten.detach_copy.default, aten.alias_copy.default):
        put(op, jnp.array)

    def normal_functional(
        x: jax.Array, mean: float = 0.0, std: float = 1.0, generator: Any = None, env: Any = None
    ) -> jax.Array:
        key = env.get_and_rotate_prng_key(generator)
        return (jax.random.normal(key, x.shape, dtype=jnp.float32) * std + mean).astype(x.dtype)

    put(aten.normal_functional.default, normal_functional, needs_env=True)

    def view_dtype(x: jax.Array, dtype: torch.dtype) -> jax.Array:
        # the MXU rounding at "high" precision reinterprets f32 bits as int32 (same width: a pure bitcast)
        from tpu_agent.runtime.xla import torchax_compat

        return jax.lax.bitcast_convert_type(x, torchax_compat.load().ops.mappings.t2j_dtype(dtype))

    for op in (aten.view.dtype, aten.view_copy.dtype):
        put(op, view_dtype)
