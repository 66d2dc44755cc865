"""The ATen decompositions applied before lowering: torch's core set, plus ``_foreach_*`` ops as loops.

torchax has no lowering for the multi-tensor ``_foreach_*`` ops that ``foreach=True`` optimizers (AdamW's
default on accelerators) issue, and torch's core decompositions leave them alone. Each is the same per-tensor
op applied across its list arguments, which is what :func:`_foreach_as_loop` traces; XLA then fuses the
per-tensor ops back together. One generic rule covers every overload (Scalar, List, ScalarList, Tensor,
in-place), so new optimizer code needs no new entry here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_FOREACH = "_foreach_"
_KEPT_WHOLE = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,)


def _foreach_as_loop(overload: torch._ops.OpOverload) -> Callable[..., Any] | None:
    name = overload.overloadpacket.__name__.removeprefix(_FOREACH)
    per_tensor = getattr(torch.ops.aten, name, None)
    if per_tensor is None:
        return None
    in_place = name.endswith("_")
    # foreach ops take positionally what some per-tensor ops take by keyword (addcdiv's ``value``)
    schema = per_tensor.default._schema if "default" in per_tensor.overloads() else None
    positional = sum(1 for a in schema.arguments if not a.kwarg_only) if schema is not None else None
    keyword_only = [a.name for a in schema.arguments if a.kwarg_only] if schema is not None else []

    def decomposed(*args: Any, **kwargs: Any) -> Any:
        if positional is not None and len(args) > positional:
            kwargs = {**dict(zip(keyword_only, args[positional:], strict=False)), **kwargs}
            args = args[:positional]
        length = next(len(a) for a in args if isinstance(a, (list, tuple)))
        results = []
        for i in range(length):
            item_args = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
            item_kwargs = {k: v[i] if isinstance(v, (list, tuple)) else v for k, v in kwargs.items()}
            results.append(per_tensor(*item_args, **item_kwargs))
        return None if in_place else results

    return decomposed


@functools.cache
def table() -> dict[Any, Callable[..., Any]]:
    """Decompositions for lowering: torch's core ATen set and the ``_foreach_*`` loops."""
    from torch._decomp import core_aten_decompositions

    result: dict[Any, Callable[..., Any]] = dict(core_aten_decompositions())
    # torch's rule for the CPU flash kernel returns the attention weights where the kernel returns its
    # logsumexp, which the backward op in the same graph reads: the op is lowered whole (see extra_ops)
    for op in _KEPT_WHOLE:
        result.pop(op, None)
    # every registered op by name: ``dir(torch.ops.aten)`` lists only the packets loaded so far
    packet_names = {
        n.removeprefix("aten::").split(".")[0]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::" + _FOREACH)
    }
    for packet_name in sorted(packet_names):
        packet = getattr(torch.ops.aten, packet_name)
        for overload_name in packet.overloads():
            overload = getattr(packet, overload_name)
            if overload in result or overload_name.endswith("out"):
                continue
            loop = _foreach_as_loop(overload)
            if loop is not None:
                result[overload] = loop
    return result
