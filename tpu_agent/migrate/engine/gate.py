"""The statement gate: top-level statements whose text holds no trigger for any rule are not visited.

Most statements of a real file have nothing CUDA-ish in them; the stdlib parser (much faster than a
libcst walk) gives each statement's line span, and a statement whose text the prefilter regex (plus the
file's own aliases of CUDA modules) does not match is marked inert, so the rule pass skips its subtree.
The same map gives the first line of every top-level statement, which the splicer's layout needs.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from tpu_agent.migrate.engine.positions import line_starts
from tpu_agent.migrate.engine.prefilter import CUDA_TOKENS

_IMPORT_RE = re.compile(r"\bimport\b")
_PAIRS: dict[type, tuple[type, ...]] = {
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
    cst.ClassDef: (ast.ClassDef,),
    cst.If: (ast.If,),
    cst.For: (ast.For, ast.AsyncFor),
    cst.While: (ast.While,),
    cst.With: (ast.With, ast.AsyncWith),
    cst.Try: (ast.Try,),
    cst.Match: (ast.Match,),
}
if sys.version_info >= (3, 11):  # except* exists from Python 3.11 (the package supports 3.10)
    _PAIRS[cst.TryStar] = (ast.TryStar,)


def _cuda_aliases(tree: ast.Module) -> list[str]:
    """Names bound by the file's imports to CUDA-ish things (``tc`` in ``import torch.cuda as tc``)."""
    names = []
    statements = list(tree.body)
    for node in tree.body:
        if isinstance(node, (ast.Try, ast.If)):
            statements.extend(node.body)
    for node in statements:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and CUDA_TOKENS.search(alias.name.encode()):
                    names.append(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if CUDA_TOKENS.search(f"{node.module}.{alias.name}".encode()):
                    names.append(alias.asname or alias.name)
    return names


@dataclass
class StatementMap:
    """What the stdlib parser tells about the libcst statements of one module."""

    inert: set[int]  # ids of statements with no trigger for any rule
    begins: list[int] | None  # first line (1-based, decorators included) of each top-level statement
    tree: ast.Module | None = None  # the stdlib parse, reused by the analyses rules ask for (value flow)


def statement_map(module: cst.Module, source: str, tree: ast.Module | None = None) -> StatementMap:
    """Top-level statements (and methods of top-level classes) whose text holds no trigger for any rule,
    and the first line of every top-level statement.

    The stdlib parser gives each statement's line span; the libcst statements are matched to it one to one
    (a ``SimpleStatementLine`` covers as many ast statements as it has small statements). Statements that
    import are always visited (their names resolve the rest). Any mismatch, or code the stdlib parser does
    not accept, disables the gate. ``tree`` is the stdlib parse of ``source`` when the caller has it already
    (:func:`~tpu_agent.migrate.engine.guard.assess`).
    """
    if tree is None:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return StatementMap(set(), None)
    aliases = _cuda_aliases(tree)
    gate = CUDA_TOKENS
    if aliases:
        gate = re.compile(
            CUDA_TOKENS.pattern + b"|\\b(?:" + "|".join(map(re.escape, aliases)).encode() + b")\\b", re.IGNORECASE
        )
    starts = line_starts(source)
    inert: set[int] = set()
    begins: list[int] = []

    def walk(cst_body: Sequence[cst.CSTNode], ast_body: list[ast.stmt], top: bool) -> bool:
        index = 0
        for stmt in cst_body:
            count = len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1
            group = ast_body[index : index + count]
            index += count
            if len(group) != count:
                return False
            if not isinstance(stmt, cst.SimpleStatementLine) and not isinstance(group[0], _PAIRS.get(type(stmt), ())):
                return False
            first = group[0]
            decorators = getattr(first, "decorator_list", None) or []
            begin = min([first.lineno, *(d.lineno for d in decorators)])
            if top:
                begins.append(begin)
            end = group[-1].end_lineno or first.lineno
            text = source[starts[begin - 1] : starts[end] if end < len(starts) else len(source)]
            if _IMPORT_RE.search(text):
                continue
            if not gate.search(text.encode("utf-8", "surrogatepass")):
                inert.add(id(stmt))
            elif isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
                if not walk(stmt.body.body, group[0].body, False):  # type: ignore[attr-defined]
                    return False
        return index == len(ast_body)

    if not walk(module.body, tree.body, True):
        return StatementMap(set(), None, tree)
    return StatementMap(inert, begins, tree)
