"""Positions of the few nodes that have findings, and where each top-level statement lies in the text.

libcst's ``PositionProvider`` computes a position for every node of a module (a metadata pass as costly
as the rule pass itself); the engine needs them only for the handful of nodes with findings. So this
module runs libcst's code generation with a state that emits nothing and records only the wanted nodes.

This is the one module that uses libcst internals: ``libcst._nodes.internal.CodegenState`` and the nodes'
``_codegen`` method. ``tests/migrate/test_positions.py`` pins the behaviour against the public
``PositionProvider`` and ``Module.code_for_node``, so a libcst release that changes them fails there first.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import libcst as cst
from libcst._nodes.internal import CodegenState

from tpu_agent.migrate.engine.context import PendingFinding

Position = tuple[int, int, int, int]  # 1-based start line, 0-based start column, end line, end column
NEWLINE_RE = re.compile(r"\r\n|\r|\n")


def line_starts(source: str) -> list[int]:
    """Offset of the first character of each line (``\\n``, ``\\r\\n`` and ``\\r`` all end a line). Text without a
    ``\\r`` is split instead of searched: the engine asks for every file's line starts three times."""
    if "\r" in source:
        return [0] + [m.end() for m in NEWLINE_RE.finditer(source)]
    return list(accumulate((len(line) + 1 for line in source.split("\n")[:-1]), initial=0))


class _PositionState(CodegenState):
    """Code generation that emits nothing and records start/end of a few wanted nodes only."""

    def __init__(self, module: cst.Module, wanted: set[int], tops: set[int], stop_when_found: bool = False) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.wanted = wanted
        self.tops = tops
        self.stop_when_found = stop_when_found  # raise _AllFound once every wanted node has its position
        self.line = 1
        self.column = 0
        self.offset = 0
        self.found: dict[int, tuple[int, int, int, int]] = {}
        self.spans: dict[int, tuple[int, int]] = {}
        self._starts: list[tuple[int, int]] = []
        self._top_start = 0

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.column += len(token)
            self.offset += len(token)

    def add_token(self, value: str) -> None:
        self.offset += len(value)
        if "\n" in value or "\r" in value:
            segments = re.split(r"\r\n?|\n", value)
            self.line += len(segments) - 1
            self.column = len(segments[-1])
        else:
            self.column += len(value)

    def pop_trailing_newline(self) -> None:
        pass

    def before_codegen(self, node: cst.CSTNode) -> None:
        key = id(node)
        if key in self.wanted:
            self._starts.append((self.line, self.column))
        if key in self.tops:
            self._top_start = self.offset

    def after_codegen(self, node: cst.CSTNode) -> None:
        key = id(node)
        if key in self.tops:
            self.spans[key] = (self._top_start, self.offset)
        if key in self.wanted:
            start = self._starts.pop()
            if key not in self.found:  # a syntactic position (without leading whitespace) wins
                self.found[key] = (*start, self.line, self.column)
            if self.stop_when_found and len(self.found) == len(self.wanted):
                raise _AllFound

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: Any = None, end_node: Any = None) -> Any:
        if id(node) in self.wanted:
            return _Recorder(self, id(node))
        return _NULL


_NULL = nullcontext()


class _AllFound(Exception):
    """Every wanted node has its position: the rest of the statement need not be generated."""


class _Recorder:
    __slots__ = ("state", "key", "start")

    def __init__(self, state: _PositionState, key: int) -> None:
        self.state = state
        self.key = key

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *exc: object) -> None:
        self.state.found[self.key] = (*self.start, self.state.line, self.state.column)


def positions(
    module: cst.Module, nodes: list[cst.CSTNode], tops: Sequence[cst.CSTNode] = ()
) -> tuple[dict[int, tuple[int, int, int, int]], dict[int, tuple[int, int]]]:
    """1-based line, 0-based column start and end of each node, and the source offsets each of ``tops``
    (top-level statements, with their leading lines) spans; both keyed by ``id(node)``."""
    state = _PositionState(module, {id(node) for node in nodes}, {id(node) for node in tops})
    module._codegen(state)
    return state.found, state.spans


@dataclass
class Layout:
    """Where each top-level statement of the original module lies in its text, from line numbers alone."""

    spans: dict[int, tuple[int, int]]  # id(statement) -> (start, end) offsets, leading lines included
    first_lines: list[int]  # 1-based line of each statement's first leading line


def layout(module: cst.Module, source: str, begins: list[int]) -> Layout | None:
    """Top-level statements are whole lines: each starts ``len(leading_lines)`` lines above its first token
    line (which the stdlib parser gave) and ends where the next starts; the footer is whole lines at the end."""
    if not module.body or not module.has_trailing_newline or len(begins) != len(module.body):
        return None
    starts = line_starts(source)
    first_lines = [begin - len(stmt.leading_lines) for begin, stmt in zip(begins, module.body, strict=True)]
    lines = len(starts) - 1
    end_line = lines - len(module.footer)  # last line of the last statement
    if (
        any(b <= a for a, b in zip(first_lines, first_lines[1:], strict=False))
        or first_lines[0] < 1
        or end_line < first_lines[-1]
    ):
        return None
    bounds = [starts[line - 1] for line in first_lines] + [starts[end_line]]
    spans = {id(stmt): (bounds[i], bounds[i + 1]) for i, stmt in enumerate(module.body)}
    return Layout(spans, first_lines)


def statement_positions(
    module: cst.Module, layout: Layout, findings: list[PendingFinding], measured: Collection[int]
) -> tuple[dict[int, tuple[int, int, int, int]], dict[int, int]]:
    """Positions of the findings, generating code only for the top-level statements that hold them; also the
    generated length of each such statement that is in ``measured`` (to check the layout against). The code of
    a statement that is not is generated only up to its last finding."""
    by_top: dict[int, list[int]] = {}
    for finding in findings:
        by_top.setdefault(finding.top, []).append(id(finding.node))
    found: dict[int, tuple[int, int, int, int]] = {}
    lengths: dict[int, int] = {}
    for top, wanted in by_top.items():
        if not 0 <= top < len(module.body):
            continue
        state = _PositionState(module, set(wanted), set(), stop_when_found=top not in measured)
        state.line = layout.first_lines[top]
        try:
            module.body[top]._codegen(state)
        except _AllFound:
            found.update(state.found)
            continue
        found.update(state.found)
        lengths[top] = state.offset
    return found, lengths
