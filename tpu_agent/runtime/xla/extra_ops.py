"""Lowerings this project adds to torchax's op table, each for a graph shape torchax handles poorly or not at all.

* ``as_strided`` / ``as_strided_copy`` / ``as_strided_scatter``: DeferAndFuse graphs reach every input as a
  strided view of its storage buffer, and write mutated inputs back the same way. torchax lowers these to
  gathers and scatters over computed indices; when the view is a (possibly transposed, broadcast) dense block
  of the buffer, which is nearly always, a slice, reshape and transpose says the same thing and XLA turns it
  into a copy-free layout change.
* ``detach_copy`` / ``alias_copy``: what functionalisation makes of ``detach`` and ``alias``; plain copies.
* ``normal_functional``: what functionalisation makes of ``normal_`` (``torch.randn`` on the device); drawn
  from the executable's PRNG key like torchax's ``normal``.
* ``random.from`` / ``random.to``: what functionalisation makes of ``random_`` (``torch.randint`` on the device);
  integers in ``[from, to)`` drawn from the executable's PRNG key. torchax has no functional ``random``.
* ``_scaled_dot_product_flash_attention_for_cpu`` and its backward: the fused attention the emulated device
  picks where the CPU would. torchax (like torch's own decomposition table) lowers the forward through
  ``_scaled_dot_product_attention_math``, whose second result is the attention *weights* (N, H, L, S), not the
  kernel's logsumexp (N, H, L); a backward in the same graph then reads weights as a logsumexp and computes
  wrong gradients. Here both ops are the kernel's math: softmax statistics in f32, the logsumexp returned as
  the backward expects it. Compiled for a TPU estimate they are TorchTPU's blockwise kernel instead
  (:mod:`.tpu_kernels`).
* ``max_pool2d_with_indices_backward`` / ``max_pool3d_with_indices_backward``: each output's gradient added at the
  input position its forward index names, in one scatter-add. torchax's rule loops over the output positions in
  Python, one scatter per position over the whole window and at the wrong dims: wrong gradients, and a program
  too large to compile (docs/runtime.md, "Measurements behind the design").
* ``_grouped_mm`` (and ``tpu_agent::grouped_mm``, the same op on any float dtype, :mod:`..emulated.cpu_gaps`):
  the mixture-of-experts grouped matmul, which torchax does not lower, as XLA's ragged dot (what a TPU runs for
  it): tokens sorted by expert times each expert's weight, or, in its backward, each expert's weight gradient.
* ``convolution_backward``: torchax has no rule; here it is the vector-Jacobian product of torchax's own
  ``convolution`` lowering (input and weight; a transposed one as the adjoint of the direct one), and the bias
  gradient a sum, each only where ``output_mask`` asks.
* ``gelu``: torch's formula, ``x/2 * (1 + erf(x/sqrt 2))``. torchax calls ``jax.nn.gelu``, whose exact form goes
  through ``erfc`` and runs several times slower than torch's GELU on XLA:CPU (docs/runtime.md, "Measurements
  behind the design").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch

from tpu_agent.runtime.emulated import cpu_gaps  # noqa: F401 - registers tpu_agent::grouped_mm, lowered below
from tpu_agent.runtime.xla import arrays, barrier, torchax_compat, tpu_kernels

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


def reads_logical_order(x: torch.Tensor, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``as_strided`` with these arguments (input, size, stride, storage offset), ``x`` its input's tensor
    or traced value, reads only elements of ``x`` in its logical order, which is all a lowering sees of it (a JAX
    array has no strides): true for a contiguous ``x`` that starts its storage and holds the whole view. On a
    transposed view or a slice, ``as_strided`` indexes the storage underneath (Longformer chunks attention that
    way), which the graph does not have: such an op runs eagerly."""
    sizes, strides = args[1], args[2]
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    start = x.storage_offset() if offset is None else offset
    end = arrays.storage_end(sizes, strides, start)
    return x.is_contiguous() and x.storage_offset() == 0 and 0 <= start and end <= x.numel()


def is_dense(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a layout covers its memory exactly once: a dense block (:func:`_dense_block`) with no broadcast
    dimension."""
    return all(size == 1 or stride for size, stride in zip(sizes, strides, strict=True)) and (
        _dense_block(sizes, strides) is not None
    )


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


def _attention_scores(
    query: jax.Array, key: jax.Array, attn_mask: jax.Array | None, is_causal: bool, scale: float | None
) -> tuple[jax.Array, float]:
    """``scale * q @ k^T`` in f32, masked as the CPU kernel masks (additive float mask, causal from top left)."""
    length, source = query.shape[-2], key.shape[-2]
    factor = scale if scale is not None else 1.0 / float(query.shape[-1]) ** 0.5
    scores = jnp.einsum("...le,...se->...ls", query.astype(jnp.float32), key.astype(jnp.float32)) * factor
    if attn_mask is not None:
        scores = (
            jnp.where(attn_mask, scores, -jnp.inf)
            if attn_mask.dtype == jnp.bool_
            else scores + attn_mask.astype(jnp.float32)
        )
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones((length, source), dtype=jnp.bool_)), scores, -jnp.inf)
    return scores, factor


def _repeat_heads(x: jax.Array, heads: int) -> jax.Array:
    """Key/value heads repeated to the query's head count (grouped-query attention)."""
    return x if x.shape[-3] == heads else jnp.repeat(x, heads // x.shape[-3], axis=-3)


def _sum_head_groups(grad: jax.Array, heads: int) -> jax.Array:
    """The gradient of :func:`_repeat_heads`: each group of query heads summed back into its key/value head."""
    if grad.shape[-3] == heads:
        return grad
    return grad.reshape(*grad.shape[:-3], heads, grad.shape[-3] // heads, *grad.shape[-2:]).sum(axis=-3)


def _probabilities(scores: jax.Array, logsumexp: jax.Array) -> jax.Array:
    """softmax from its logsumexp; rows that mask everything are all zero, as in the kernel."""
    finite = jnp.isfinite(logsumexp)[..., None]
    return jnp.where(finite, jnp.exp(scores - jnp.where(finite, logsumexp[..., None], 0.0)), 0.0)


def _refuse_dropout(dropout_p: float) -> None:
    """Dropout inside the fused kernel draws torch's CPU random stream, which XLA cannot reproduce: raising
    makes the XLA executors run that graph op by op instead, never a result with other numbers."""
    if dropout_p:
        raise NotImplementedError("fused CPU attention with dropout has no XLA lowering here")


def flash_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: jax.Array | None = None,
    scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``(output, logsumexp)`` of ``_scaled_dot_product_flash_attention_for_cpu`` (TorchTPU's blockwise kernel
    when compiling for a TPU target: :mod:`.tpu_kernels`)."""
    _refuse_dropout(dropout_p)
    if tpu_kernels.active():
        return tpu_kernels.flash_attention(query, key, value, is_causal, attn_mask, scale)
    heads = query.shape[-3]
    scores, _ = _attention_scores(query, _repeat_heads(key, heads), attn_mask, is_causal, scale)
    logsumexp = jax.nn.logsumexp(scores, axis=-1)
    weights = _probabilities(scores, logsumexp)
    output = jnp.einsum("...ls,...se->...le", weights, _repeat_heads(value, heads).astype(jnp.float32))
    return output.astype(query.dtype), logsumexp


def flash_attention_backward(
    grad_out: jax.Array,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    out: jax.Array,
    logsumexp: jax.Array,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: jax.Array | None = None,
    scale: float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(grad_query, grad_key, grad_value)`` of ``_scaled_dot_product_flash_attention_for_cpu_backward``."""
    _refuse_dropout(dropout_p)
    if tpu_kernels.active():
        return tpu_kernels.flash_attention_backward(
            grad_out, query, key, value, out, logsumexp, is_causal, attn_mask, scale
        )
    heads, kv_heads = query.shape[-3], key.shape[-3]
    keys, values = _repeat_heads(key, heads), _repeat_heads(value, heads).astype(jnp.float32)
    scores, factor = _attention_scores(query, keys, attn_mask, is_causal, scale)
    weights = _probabilities(scores, logsumexp.astype(jnp.float32))
    grad = grad_out.astype(jnp.float32)
    grad_value = jnp.einsum("...ls,...le->...se", weights, grad)
    grad_weights = jnp.einsum("...le,...se->...ls", grad, values)
    row = jnp.sum(grad * out.astype(jnp.float32), axis=-1, keepdims=True)
    grad_scores = weights * (grad_weights - row) * factor
    grad_query = jnp.einsum("...ls,...se->...le", grad_scores, keys.astype(jnp.float32))
    grad_key = jnp.einsum("...ls,...le->...se", grad_scores, query.astype(jnp.float32))
    return (
        grad_query.astype(query.dtype),
        _sum_head_groups(grad_key, kv_heads).astype(key.dtype),
        _sum_head_groups(grad_value, kv_heads).astype(value.dtype),
    )


def gelu(x: jax.Array, approximate: str = "none") -> jax.Array:
    if approximate == "tanh":
        return jax.nn.gelu(x, approximate=True)
    return x * 0.5 * (1.0 + jax.scipy.special.erf(x * (2.0**-0.5)))


def max_pool_backward(
    spatial_dims: int,
    grad_output: jax.Array,
    self: jax.Array,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    ceil_mode: bool,
    indices: jax.Array,
) -> jax.Array:
    """The gradient of ``max_pool{2,3}d_with_indices`` w.r.t. its input: the indices are flat positions within
    each input plane (torch's convention), so every (batch, channel) plane scatters its outputs' gradients at
    them, adding where overlapping windows chose the same element. The window parameters shaped the indices
    already and are not needed again."""
    planes = math.prod(self.shape[: self.ndim - spatial_dims])
    plane_size = math.prod(self.shape[self.ndim - spatial_dims :])
    rows = jnp.arange(planes)[:, None]
    grads = grad_output.reshape(planes, -1)
    accumulate = jnp.float32 if grads.dtype in (jnp.bfloat16, jnp.float16) else grads.dtype
    out = (
        jnp.zeros((planes, plane_size), accumulate).at[rows, indices.reshape(planes, -1)].add(grads.astype(accumulate))
    )
    return out.astype(grads.dtype).reshape(self.shape)


def grouped_mm(
    mat_a: jax.Array,
    mat_b: jax.Array,
    offs: jax.Array | None = None,
    bias: jax.Array | None = None,
    out_dtype: torch.dtype | None = None,
) -> jax.Array:
    """``_grouped_mm``: ``offs`` holds each group's end (cumulative sizes) along the ragged dimension: the rows of a
    2-D ``mat_a`` against a 3-D ``mat_b`` (one matrix per group), the contracted dimension of two 2-D operands (a
    result per group), the columns of a 2-D ``mat_b`` against a 3-D ``mat_a``; no ``offs``: a batched matmul.
    Accumulated in f32 as the MXU does."""
    if bias is not None:
        raise NotImplementedError("_grouped_mm with a bias has no lowering (torch's kernels take none either)")
    dtype = mat_a.dtype if out_dtype is None else torchax_compat.load().ops.mappings.t2j_dtype(out_dtype)
    wide = jnp.float32 if mat_a.dtype in (jnp.bfloat16, jnp.float16) else None
    if offs is None:
        return jnp.matmul(mat_a, mat_b, preferred_element_type=wide).astype(dtype)
    sizes = jnp.diff(offs.astype(jnp.int32), prepend=jnp.zeros((1,), jnp.int32))
    if mat_a.ndim == 2 and mat_b.ndim == 3:
        out = jax.lax.ragged_dot(mat_a, mat_b, sizes, preferred_element_type=wide)
    elif mat_a.ndim == 2 and mat_b.ndim == 2:
        numbers = jax.lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(([1], [0]), ([], [])), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
        )
        out = jax.lax.ragged_dot_general(mat_a, mat_b, sizes, numbers, preferred_element_type=wide)
    else:  # (G, M, K) x (K, N), columns grouped: each column from its group's product (rare: not in MoE layers)
        full = jnp.einsum("gmk,kn->gmn", mat_a, mat_b, preferred_element_type=wide)
        group = jnp.searchsorted(offs, jnp.arange(mat_b.shape[1]), side="right")
        out = jnp.take_along_axis(full, group[None, None, :], axis=0)[0]
    return out.astype(dtype)


def convolution_backward(
    convolution: Callable[..., jax.Array],
    grad_output: jax.Array,
    input: jax.Array,
    weight: jax.Array,
    bias_sizes: Any,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    output_mask: Sequence[bool],
) -> tuple[jax.Array | None, jax.Array | None, jax.Array | None]:
    """The gradients of ``convolution`` (torchax's lowering of the forward) w.r.t. its input and weight, by
    ``jax.vjp``, and the bias's (the output gradient summed over all but the channel dim), as torch returns them:
    ``None`` where ``output_mask`` asks for none."""

    def direct(y: jax.Array, w: jax.Array) -> jax.Array:
        return convolution(y, w, None, stride, padding, dilation, False, [0] * len(stride), groups)

    def forward(x: jax.Array, w: jax.Array) -> jax.Array:
        if not transposed:
            return direct(x, w)
        # a transposed convolution is the adjoint of the direct one with the same weight (torchax's own transposed
        # rule regroups a grouped weight wrongly), on the output size torch gives it
        sizes = [
            (n - 1) * s - 2 * p + d * (k - 1) + o + 1
            for n, s, p, d, k, o in zip(
                x.shape[2:], stride, padding, dilation, w.shape[2:], output_padding, strict=True
            )
        ]
        shape = (x.shape[0], w.shape[1] * groups, *sizes)
        _, adjoint = jax.vjp(lambda y: direct(y, w), jnp.zeros(shape, x.dtype))
        return adjoint(x)[0]

    _, pullback = jax.vjp(forward, input, weight)
    grad_input, grad_weight = pullback(grad_output.astype(input.dtype))
    grad_bias = None
    if output_mask[2]:
        grad_bias = jnp.sum(grad_output, axis=(0, *range(2, grad_output.ndim))).astype(grad_output.dtype)
    return (grad_input if output_mask[0] else None, grad_weight if output_mask[1] else None, grad_bias)


def _or_torchax(fast: Callable[..., Any], general: Callable[..., Any]) -> Callable[..., Any]:
    def lowered(*args: Any, **kwargs: Any) -> Any:
        result = fast(*args, **kwargs)
        return general(*args, **kwargs) if result is None else result

    return lowered


def set_lowering(
    table: dict[Any, Any],
    op: Any,
    func: Callable[..., Any],
    *,
    torch_op: Any = None,
    is_jax_function: bool = True,
    is_user_defined: bool = False,
    needs_env: bool = False,
    is_view_op: bool = False,
) -> None:
    """Make ``func`` the lowering of ``op`` in one of a torchax environment's private op tables (``env._ops``,
    ``env._decomps``): the one place this project writes them.

    torchax has no public call that replaces an op's lowering in an environment; its ``Operator`` record is built
    here with keywords, so a torchax release that renames or reorders its flags fails here, loudly, instead of
    having a flag read as another. ``torch_op`` is the op the record names (default ``op``; an overload packet's
    entry may name another); ``needs_env``: ``func`` takes the environment as ``env=`` (for the PRNG key)."""
    operator = torchax_compat.load().ops.ops_registry.Operator
    table[op] = operator(
        torch_op=op if torch_op is None else torch_op,
        func=func,
        is_jax_function=is_jax_function,
        is_user_defined=is_user_defined,
        needs_env=needs_env,
        is_view_op=is_view_op,
    )


def install(env: Any) -> None:
    """Add or replace this module's lowerings in a torchax environment's op table."""
    aten = torch.ops.aten

    def put(op: Any, func: Callable[..., Any], needs_env: bool = False) -> None:
        set_lowering(env._ops, op, func, needs_env=needs_env)

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

    def random_from(
        x: jax.Array, low: int, high: int | None = None, generator: Any = None, env: Any = None
    ) -> jax.Array:
        if high is None:  # torch: up to the dtype's largest value (its exactly representable integers for floats)
            high = 2 ** jnp.finfo(x.dtype).nmant + 1 if jnp.issubdtype(x.dtype, jnp.floating) else None
            high = int(jnp.iinfo(x.dtype).max) if high is None else high
        key = env.get_and_rotate_prng_key(generator)
        return jax.random.randint(key, x.shape, low, high, dtype=jnp.int64).astype(x.dtype)

    def random_to(x: jax.Array, high: int, generator: Any = None, env: Any = None) -> jax.Array:
        return random_from(x, 0, high, generator, env)

    put(getattr(aten.random, "from"), random_from, needs_env=True)
    put(aten.random.to, random_to, needs_env=True)
    put(aten.gelu.default, gelu)
    put(aten._grouped_mm.default, grouped_mm)
    put(torch.ops.tpu_agent.grouped_mm.default, grouped_mm)
    put(
        aten.convolution_backward.default,
        functools.partial(convolution_backward, general(aten.convolution.default)),
    )
    put(aten.max_pool2d_with_indices_backward.default, functools.partial(max_pool_backward, 2))
    put(aten.max_pool3d_with_indices_backward.default, functools.partial(max_pool_backward, 3))
    put(aten._scaled_dot_product_flash_attention_for_cpu.default, flash_attention)
    put(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, flash_attention_backward)

    put(barrier.OP, barrier.lowered)

    def view_dtype(x: jax.Array, dtype: torch.dtype) -> jax.Array:
        # the MXU rounding at "high" precision reinterprets f32 bits as int32 (same width: a pure bitcast)
        return jax.lax.bitcast_convert_type(x, torchax_compat.load().ops.mappings.t2j_dtype(dtype))

    for op in (aten.view.dtype, aten.view_copy.dtype):
        put(op, view_dtype)
