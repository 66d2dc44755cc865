"""The libcst helpers the engine and the rule families both use: two builders, and the walk that skips atoms.

They live below both, beside the data model: the rules import the engine's context, so the context may not import
the rules' helpers, and the rules may not import the engine package, whose __init__ imports the rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import libcst as cst

_OPERATORS = (cst.BaseUnaryOp, cst.BaseBinaryOp, cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseAugOp)
# Nodes whose subtrees hold nothing but whitespace, comments and brackets, which no rule looks at. Three in five
# nodes of a module are such tokens, and libcst's walk rebuilds every node it descends into (a new node, validated),
# even for a visitor that only reads: walks that skip the atoms' insides cost a fraction.
ATOMS = frozenset(
    {
        *(kind for kind in vars(cst).values() if isinstance(kind, type) and issubclass(kind, _OPERATORS)),
        *(cst.Comma, cst.Dot, cst.Colon, cst.Semicolon, cst.AssignEqual, cst.ImportStar),
        *(cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.Newline, cst.Comment),
        cst.EmptyLine,
        *(cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket),
        *(cst.LeftCurlyBrace, cst.RightCurlyBrace, cst.Asynchronous),
        *(cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.Ellipsis, cst.FormattedStringText),
    }
)


class TreeReader(cst.CSTVisitor):
    """A read-only visitor that visits every node but what is inside an atom (:data:`ATOMS`): its ``visit_Name``
    and the like are called, no ``visit_`` method for whitespace or brackets is."""

    def on_visit(self, node: cst.CSTNode) -> bool:
        return super().on_visit(node) and type(node) not in ATOMS


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


_FIELDS: dict[type, tuple[str, ...]] = {}  # node type -> its fields, looked up once per type
_NODE_TYPES: dict[type, bool] = {}  # value type -> whether it is a node (CSTNode is an ABC: isinstance is slow)


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node below and including ``node`` but what is inside an atom, in no particular order. Unlike a libcst
    visitor it builds nothing (a visit rebuilds every node it enters): for searches that only read."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        kind = type(current)
        if kind in ATOMS:
            continue
        names = _FIELDS.get(kind)
        if names is None:
            names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(current))
        for name in names:
            value = getattr(current, name)
            if isinstance(value, (list, tuple)):
                stack.extend(item for item in value if _is_node(item))
            elif _is_node(value):
                stack.append(value)


def _is_node(value: object) -> bool:
    kind = type(value)
    found = _NODE_TYPES.get(kind)
    if found is None:
        found = _NODE_TYPES[kind] = issubclass(kind, cst.CSTNode)
    return found
