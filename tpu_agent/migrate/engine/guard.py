"""Parsing that no input file can crash or hang: a stdlib pre-check, and a sacrificial process for risky files.

libcst's native parser recurses once per nesting level: a few thousand nested parentheses overflow its
stack and kill the whole process (SIGSEGV), and long operator or call chains (``1+1+...``, ``f()()()...``)
make it run for minutes. CPython's own parser is iterative where it matters and refuses such code with an
exception (``too many nested parentheses``, ``RecursionError``). So every Python text is first parsed by
:func:`ast.parse` (:func:`assess`; the tree is reused by the statement gate, so this costs no extra parse):

* code CPython refuses for its nesting is reported as unparsable, with its line, and never reaches libcst;
* code nested deeper than :data:`SAFE_DEPTH` (ordinary code stays below 100), and code the stdlib parser
  rejects for another reason (newer syntax libcst accepts) unless its tokens show no deep structure, is
  migrated in a sacrificial child process (:func:`run_isolated`) under a per-file time budget: a crash or an
  overrun costs that one file, which is reported as skipped, and the run goes on;
* everything else is migrated in-process, at full speed.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import io
import multiprocessing
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tpu_agent.migrate.analysis.astnodes import depth

SAFE_DEPTH = 150  # deepest stdlib-AST nesting migrated in-process (torch's own sources stay below 100)
SAFE_LOGICAL_LINE_TOKENS = 600  # for text the stdlib parser rejects: longest statement migrated in-process
SAFE_BRACKET_DEPTH = 100
PYTHON_NESTING_MESSAGES = ("too many nested parentheses", "too many levels of indentation")

T = TypeVar("T")


class SourceProblem(Exception):
    """Something about a source text that stops its migration, at ``line``/``column`` (1-based)."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.line = line
        self.column = column

    def relocated(self, prefix: str, line: int) -> SourceProblem:
        """The same problem, for a text embedded in a larger one (a notebook cell): ``prefix: message``."""
        moved = copy.copy(self)
        moved.args = (f"{prefix}: {self}",)
        moved.line = line
        return moved


class ParseFailure(SourceProblem):
    """The text is not Python this tool can parse."""


class IsolationFailure(SourceProblem):
    """The sacrificial process gave no result: it ran past the time budget, died, or failed."""


@dataclass(frozen=True)
class Assessment:
    """What the stdlib parser says about a text before libcst sees it."""

    tree: ast.Module | None  # None when the stdlib parser rejected the text (libcst may still accept it)
    isolate: bool  # migrate it in a sacrificial process under the time budget
    line: int  # where the risk is: the deepest node, or the stdlib parser's syntax error
    reason: str  # what makes it risky, for the skip message
    # the stdlib parser's error, reported when libcst rejects the text too (its own positions are less exact)
    error: ParseFailure | None = None


def assess(source: str) -> Assessment:
    """Parse ``source`` with the stdlib parser; raise :class:`ParseFailure` for nesting CPython itself refuses
    and for null bytes."""
    if "\0" in source:
        offset = source.index("\0")
        line = source.count("\n", 0, offset) + 1
        raise ParseFailure("source contains a null byte", line, offset - source.rfind("\n", 0, offset))
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        line, column = exc.lineno or 1, exc.offset or 1
        if any(message in (exc.msg or "") for message in PYTHON_NESTING_MESSAGES):
            raise ParseFailure(f"{exc.msg} (Python refuses nesting this deep)", line, column) from exc
        assessment = _assess_tokens(source, line, exc.msg or "invalid syntax")
        return dataclasses.replace(assessment, error=ParseFailure(exc.msg or "invalid syntax", line, column))
    except (RecursionError, MemoryError) as exc:
        line = _deepest_line(source)
        raise ParseFailure("nested too deeply for Python's parser (Python cannot compile it either)", line, 1) from exc
    node = _too_deep(tree, SAFE_DEPTH) if depth(tree) > SAFE_DEPTH else None
    if node is not None:
        return Assessment(tree, True, getattr(node, "lineno", 1), f"code nested more than {SAFE_DEPTH} levels deep")
    return Assessment(tree, False, 1, "")


def _too_deep(tree: ast.AST, limit: int) -> ast.AST | None:
    """The first node found deeper than ``limit`` levels, or None (iterative: deep trees cannot overflow it). Run
    only for trees :func:`~tpu_agent.migrate.analysis.astnodes.depth` finds too deep, to name the place.

    It reads the fields itself: the same children, in the same order, as ``ast.iter_child_nodes`` yields, at a
    third of the cost of that generator."""
    stack: list[tuple[ast.AST, int]] = [(tree, 1)]
    pop, push, node_type = stack.pop, stack.append, ast.AST
    while stack:
        node, depth = pop()
        if depth > limit:
            return node
        depth += 1
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, node_type):
                        push((item, depth))
            elif isinstance(value, node_type):
                push((value, depth))
    return None


def _assess_tokens(source: str, line: int, message: str) -> Assessment:
    """For text the stdlib parser rejects: in-process only when the tokens show shallow, short statements."""
    reason = f"code the stdlib parser rejects at line {line} ({message})"
    depth, depth_line, longest = _token_shape(source)
    if depth > SAFE_BRACKET_DEPTH:
        return Assessment(None, True, depth_line, f"brackets nested {depth} levels deep")
    return Assessment(None, longest > SAFE_LOGICAL_LINE_TOKENS, line, reason)


def _token_shape(source: str) -> tuple[int, int, int]:
    """(deepest bracket nesting, its line, most tokens in one logical line) from the tokenizer.

    The tokenizer is a flat loop (it cannot recurse into trouble); where it stops on an error (an unclosed
    bracket at the end of the file), the shape of what it read so far is the answer.
    """
    depth = deepest = deepest_line = tokens = longest = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.OP and token.string in "([{":
                depth += 1
                if depth > deepest:
                    deepest, deepest_line = depth, token.start[0]
            elif token.type == tokenize.OP and token.string in ")]}":
                depth = max(0, depth - 1)
            if token.type == tokenize.NEWLINE:
                tokens = 0
            else:
                tokens += 1
                longest = max(longest, tokens)
    except (tokenize.TokenError, SyntaxError):
        pass
    return deepest, deepest_line, longest


def _deepest_line(source: str) -> int:
    """The line where brackets nest deepest, else where the longest statement starts (for error messages)."""
    depth, line, _ = _token_shape(source)
    if depth > 1:
        return line
    longest = max(enumerate(source.splitlines(), start=1), key=lambda item: len(item[1]), default=(1, ""))
    return longest[0]


def _child(connection: Any, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Entry point of the sacrificial process: run ``function`` and send back its result or exception."""
    try:
        connection.send(("ok", function(*args)))
    except ParseFailure as exc:
        connection.send(("parse-failure", (str(exc), exc.line, exc.column)))
    except BaseException as exc:  # report every failure to the parent; the process ends right after
        connection.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        connection.close()


def run_isolated(function: Callable[..., T], args: tuple[Any, ...], budget_s: float, context: Any) -> T:
    """``function(*args)`` in a child process that is killed after ``budget_s`` seconds.

    A :class:`ParseFailure` in the child is raised again here; a crash, a timeout or any other exception
    raises :class:`IsolationFailure`. ``function`` and ``args`` must be picklable (the child may be started
    by a forkserver); ``context`` is the multiprocessing context to start it with.
    """
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, function, args), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(budget_s):
            if process.is_alive():
                raise IsolationFailure(f"gave up after the {budget_s:g} s per-file time budget")
            raise IsolationFailure(f"the parser process died ({_exit_reason(process)})")
        try:
            status, payload = receiver.recv()
        except EOFError:
            raise IsolationFailure(f"the parser process died ({_exit_reason(process)})") from None
    finally:
        receiver.close()
        if process.is_alive():
            process.kill()
        process.join(5)
    if status == "ok":
        return payload
    if status == "parse-failure":
        message, line, column = payload
        raise ParseFailure(message, line, column)
    raise IsolationFailure(f"the parser process failed ({payload})")


def _exit_reason(process: Any) -> str:
    process.join(1)
    code = process.exitcode
    if code is None:
        return "no exit status"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"


@functools.lru_cache(maxsize=1)
def process_context() -> multiprocessing.context.BaseContext:
    """Where worker and sacrificial processes start from.

    forkserver: children start from a clean process (no threads of the caller, e.g. a progress bar or the MCP
    server's), with the engine and its rules imported once in the server; spawn where there is no forkserver.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["tpu_agent.migrate.engine.worker"])
        return context
    return multiprocessing.get_context("spawn")
