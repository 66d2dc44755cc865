"""FX code generation for ops whose names are Python keywords (``aten.random.from``).

FX turns every traced graph into Python source that names each ATen overload by attribute
(``torch.ops.aten.random.from(x, 0, 10)``). An overload named after a keyword (``random.from``, which
``torch.randint(..., device=dev)`` puts in a DeferAndFuse graph) makes that source a ``SyntaxError``, so the graph
could not be traced (``make_fx``), split (``split_module``) or compiled and ran op by op instead. :func:`install`
makes FX spell such a name ``getattr(torch.ops.aten.random, 'from')``: every name FX generates in this
process (DeferAndFuse's traces, the split graphs, AOTAutograd's graphs of ``torch.compile``) stays valid Python.
Names without a keyword are left exactly as FX spells them.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from typing import Any

import torch.fx.graph

_original: Callable[[Any], str] = torch.fx.graph._get_qualified_name


def python_expression(qualified_name: str) -> str:
    """``qualified_name`` (dotted) as an expression that evaluates to the same object: keyword parts become
    ``getattr`` calls (``torch.ops.aten.random.from`` -> ``getattr(torch.ops.aten.random, 'from')``)."""
    parts = qualified_name.split(".")
    first = next((i for i, part in enumerate(parts) if keyword.iskeyword(part)), None)
    if first is None or first == 0:
        return qualified_name
    expression = ".".join(parts[:first])
    for part in parts[first:]:
        expression = f"getattr({expression}, {part!r})"
    return expression


def _qualified_name(func: Any) -> str:
    return python_expression(_original(func))


def install() -> None:
    """Make FX's code generation spell keyword names with ``getattr`` (idempotent; for the whole process)."""
    torch.fx.graph._get_qualified_name = _qualified_name
