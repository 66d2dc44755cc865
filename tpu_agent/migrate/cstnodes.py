"""The two libcst builders the engine's context and the rule families both use.

They live below both, beside the data model: the rules import the engine's context, so the context may not import
the rules' helpers, and the rules may not import the engine package, whose __init__ imports the rules.
"""

from __future__ import annotations

import libcst as cst


def dotted(path: str) -> cst.Name | cst.Attribute:
    """``"torch.accelerator.synchronize"`` as an attribute chain (cheaper than parsing an expression)."""
    parts = path.split(".")
    node: cst.Name | cst.Attribute = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def string_like(template: cst.CSTNode | None, value: str) -> cst.SimpleString:
    """A string literal holding ``value``, quoted the way ``template`` was (double quotes by default)."""
    quote = '"'
    if isinstance(template, cst.SimpleString) and template.quote in ("'", '"'):
        quote = template.quote
    elif isinstance(template, cst.FormattedString) and template.end in ("'", '"'):
        quote = template.end
    return cst.SimpleString(f"{quote}{value}{quote}")
