"""What DeferAndFuse recording knows about an op's outputs without running it, cached per op signature.

Recording an op needs its outputs' shapes, strides and dtypes, and the way to get them is to run the op on
meta tensors. Most meta kernels are Python (torch's ``_refs``/``_prims``), several times the cost of the CPU
kernel they describe, and a training step records the same few hundred signatures every time. So the first
recording of a signature runs the meta kernel and keeps a description of the outputs (:class:`Inferred`);
later recordings of the same signature rebuild the outputs from it.

A signature is the op and, for every argument, what the meta kernel can see: a tensor's shape, strides,
offset, dtype and conjugate/negative bits, and the value of every other argument. Float values are left out
(only their type counts) except for ops that size their output from floats (resampling and pooling), so an
optimizer whose step size changes every step still records from the cache. Arguments of other kinds make the
op uncacheable (it is inferred each time, as before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tpu_agent.runtime.emulated import tensor as tt

_Tensor = torch.Tensor
_TpuTensor = tt.TpuTensor
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout})
MAX_ENTRIES = 8192


class _Uncacheable(Exception):
    """An argument or output this cache cannot describe."""


def layout_key(x: torch.Tensor) -> tuple:
    """What a meta kernel sees of tensor ``x``: whether it is a tpu tensor, its shape, strides, offset, dtype and
    conjugate/negative bits."""
    return (type(x) is tt.TpuTensor, x.shape, x.stride(), x.storage_offset(), x.dtype, x.is_conj(), x.is_neg())


def _arg_key(x: Any, exact_floats: bool) -> Any:
    t = type(x)
    if t is tt.TpuTensor:
        layout = x._layout  # a tpu tensor keeps its key: weights and recorded outputs are keyed many times
        if layout is None:
            layout = x._layout = layout_key(x)
        return layout
    if isinstance(x, _Tensor):
        return layout_key(x)
    if t is list or t is tuple:
        for y in x:  # a loop, not all(): sizes, dims and strides reach here on most view and reduction ops
            if type(y) is not int:
                return (t, tuple([_arg_key(y, exact_floats) for y in x]))
        return (t, tuple(x))  # sizes, dims, strides: the values are the key (no nested tuples)
    if t is float and not exact_floats:
        return (t,)  # an optimizer's step size changes every step; only its type can change an output's layout
    if t in _SCALARS:
        return (t, x)
    raise _Uncacheable


# Ops whose output shape can depend on a float's value (scale factors, output ratios): keyed on exact floats.
_SHAPE_FROM_FLOATS = ("upsample", "interpolate", "pool", "grid_sampler", "affine_grid")
_exact_floats: dict[int, bool] = {}


def _needs_exact_floats(func: Any) -> bool:
    exact = _exact_floats.get(id(func))
    if exact is None:
        name = func._schema.name
        exact = _exact_floats[id(func)] = any(part in name for part in _SHAPE_FROM_FLOATS)
    return exact


def key_of(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The signature of this call, or ``None`` when an argument cannot be part of one."""
    exact = _exact_floats.get(id(func))
    if exact is None:
        exact = _needs_exact_floats(func)
    positional = []
    try:
        for a in args:
            if type(a) is _TpuTensor:  # _arg_key's first case, inlined: most arguments are tpu tensors
                layout = a._layout
                if layout is None:
                    layout = a._layout = layout_key(a)
                positional.append(layout)
            else:
                positional.append(_arg_key(a, exact))
        named = tuple([(k, _arg_key(v, exact)) for k, v in kwargs.items()]) if kwargs else ()
    except _Uncacheable:
        return None
    # overloads live forever; id avoids hashing them in Python. Symbolic sizes (while Dynamo traces) make the
    # key unhashable: lookup and store treat such a key as a miss.
    return (id(func), tuple(positional), named)


@dataclass(frozen=True)
class Inferred:
    """The outputs of one signature: each an input (in-place and ``out=`` ops return their argument), a new
    tensor's layout, or a plain value; ``signature`` is the graph-hash text of the op."""

    outputs: Any
    signature: str


def _describe(out: Any, margs: list, mkwargs: dict, args: tuple, kwargs: dict) -> Any:
    t = type(out)
    if t is tuple or t is list:
        return (t, [_describe(o, margs, mkwargs, args, kwargs) for o in out])
    if isinstance(out, _Tensor):
        for i, m in enumerate(margs):
            if m is out:
                if type(args[i]) is not tt.TpuTensor:
                    raise _Uncacheable
                return ("arg", i)
        for k, m in mkwargs.items():
            if m is out:
                if type(kwargs[k]) is not tt.TpuTensor:
                    raise _Uncacheable
                return ("kwarg", k)
        return ("new", (True, *layout_key(out)[1:]))  # the layout key of the tpu tensor built from it
    return ("value", out)


def describe(mout: Any, margs: list, mkwargs: dict, args: tuple, kwargs: dict, signature: str) -> Inferred | None:
    """What to keep about ``mout`` (the meta outputs for meta arguments ``margs``/``mkwargs``), or ``None``."""
    try:
        return Inferred(_describe(mout, margs, mkwargs, args, kwargs), signature)
    except _Uncacheable:
        return None


def build(description: Any, args: tuple, kwargs: dict) -> Any:
    """The deferred tpu outputs of a recorded call, from its signature's description."""
    kind = description[0]
    if kind == "new":
        return tt.wrap_pending_layout(description[1])
    if kind == "arg":
        return args[description[1]]
    if kind == "kwarg":
        return kwargs[description[1]]
    if kind == "value":
        return description[1]
    return kind(build(d, args, kwargs) for d in description[1])


_cache: dict[tuple, Inferred] = {}


def lookup(key: tuple) -> Inferred | None:
    try:
        return _cache.get(key)
    except TypeError:  # an unhashable key (symbolic sizes): never cached
        return None


def store(key: tuple, inferred: Inferred) -> None:
    if len(_cache) >= MAX_ENTRIES:
        _cache.clear()
    try:
        _cache[key] = inferred
    except TypeError:  # an unhashable key (symbolic sizes): inferred each time
        pass
