"""Concrete code changes for agents: small, local edits rendered as unified diffs.

Each helper reads the user's file, makes one edit at a known line, and returns the diff, or ``None`` when
the line no longer looks as expected (the file changed since the capture) so that no finding ever ships a
diff that would not apply.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
from pathlib import Path

from tpu_agent.fsutil import read_regular

#: A capture names the user's source files; a huge or odd one is skipped, not read.
MAX_SOURCE_BYTES = 2_000_000


def _read(path: str) -> list[str] | None:
    try:
        source = read_regular(Path(path), limit=MAX_SOURCE_BYTES, follow_symlinks=True)  # a capture names it
        return source.decode("utf-8").splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        return None


def display_path(path: str) -> str:
    """The path as a person types it: relative to the working directory when inside it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def _diff(path: str, before: list[str], after: list[str]) -> str | None:
    """Unified diff; ``a/``/``b/`` prefixes for relative paths (``git apply``), none for absolute ones
    (``patch -p0``)."""
    if before == after:
        return None
    name = display_path(path)
    old, new = (name, name) if os.path.isabs(name) else (f"a/{name}", f"b/{name}")
    return "".join(difflib.unified_diff(before, after, fromfile=old, tofile=new, n=2))


_NOT_A_STATEMENT = ("@", "#", "def ", "async ", "class ", "elif ", "else", "except", "finally")


def _indent(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def replace_on_line(path: str, line: int, pattern: str, replacement: str) -> str | None:
    """Regex-replace ``pattern`` on ``line`` (1-based)."""
    lines = _read(path)
    if lines is None or not 1 <= line <= len(lines):
        return None
    new_text, count = re.subn(pattern, replacement, lines[line - 1], count=1)
    if not count:
        return None
    return _diff(path, lines, lines[: line - 1] + [new_text] + lines[line:])


def insert_after_torch_import(path: str, statement: str) -> str | None:
    """Add ``statement`` right after the first ``import torch`` line (where global TPU settings belong)."""
    lines = _read(path)
    if lines is None or any(statement in text for text in lines):
        return None
    for index, text in enumerate(lines):
        if re.match(r"^import torch\s*$", text):
            return _diff(path, lines, lines[: index + 1] + [statement + "\n"] + lines[index + 1 :])
    return None


def wrap_line_in_with(path: str, line: int, with_statement: str) -> str | None:
    """Put ``line`` (a single-line statement) under ``with <with_statement>:``."""
    return wrap_line(path, line, f"with {with_statement}:")


def wrap_line(path: str, line: int, header: str) -> str | None:
    """Put ``line`` (a single-line statement) under a block ``header`` (``with ...:``, ``if ...:``)."""
    lines = _read(path)
    if lines is None or not 1 <= line <= len(lines):
        return None
    text = lines[line - 1]
    stripped = text.strip()
    if not stripped or stripped.startswith(_NOT_A_STATEMENT) or stripped.endswith((":", "(", "[", "{", ",", "\\")):
        return None
    indent = _indent(text)
    new = [f"{indent}{header}\n", f"{indent}    {text.lstrip()}"]
    return _diff(path, lines, lines[: line - 1] + new + lines[line:])


def add_decorator(path: str, def_line: int, decorator: str) -> str | None:
    """Add ``@decorator`` above the ``def`` at ``def_line``."""
    lines = _read(path)
    if lines is None or not 1 <= def_line <= len(lines) or not re.match(r"\s*(async\s+)?def\s", lines[def_line - 1]):
        return None
    text = lines[def_line - 1]
    return _diff(path, lines, lines[: def_line - 1] + [f"{_indent(text)}@{decorator}\n"] + lines[def_line - 1 :])


def add_call_kwargs(path: str, line: int, callee: str, kwargs: dict[str, str]) -> str | None:
    """Add keyword arguments to the ``callee(...)`` call starting on ``line`` (it may span lines).

    Arguments already present are replaced, so ``num_workers=0`` becomes ``num_workers=4``.
    """
    lines = _read(path)
    if lines is None or not 1 <= line <= len(lines):
        return None
    start = lines[line - 1].find(f"{callee}(")
    if start < 0:
        return None
    depth, row, col = 0, line - 1, start + len(callee)
    while row < len(lines):
        text = lines[row]
        while col < len(text):
            char = text[col]
            if char in "([{":
                depth += 1
            elif char in ")]}":
                depth -= 1
                if depth == 0:
                    return _finish_call_edit(path, lines, line - 1, row, col, kwargs)
            col += 1
        row, col = row + 1, 0
    return None


def _finish_call_edit(
    path: str, lines: list[str], first: int, row: int, col: int, kwargs: dict[str, str]
) -> str | None:
    new_lines = list(lines)
    pending = dict(kwargs)
    for index in range(first, row + 1):
        for name in list(pending):
            pattern = rf"\b{name}\s*=\s*[^,)\n]+"
            if re.search(pattern, new_lines[index]):
                new_lines[index] = re.sub(pattern, f"{name}={pending.pop(name)}", new_lines[index], count=1)
    if pending:
        text = new_lines[row]
        addition = ", ".join(f"{k}={v}" for k, v in pending.items())
        if not text[:col].strip() and row > first:  # the closing parenthesis is on a line of its own
            previous = new_lines[row - 1]
            if not previous.rstrip().endswith((",", "(")):
                new_lines[row - 1] = previous.rstrip() + ",\n"
            new_lines.insert(row, f"{_indent(previous)}{addition},\n")
        else:
            before = text[:col].rstrip()
            separator = "" if before.endswith(("(", ",")) else ", "
            new_lines[row] = f"{before}{separator}{addition}{text[col:]}"
    return _diff(path, lines, new_lines)


def _statement_end(lines: list[str], row: int) -> int:
    """Index of the last line of the statement starting at ``row`` (brackets balanced; strings not parsed)."""
    depth = 0
    for index in range(row, len(lines)):
        for char in lines[index].split("#", 1)[0]:
            depth += char in "([{"
            depth -= char in ")]}"
        if depth <= 0:
            return index
    return row


def in_loop(path: str, line: int) -> bool:
    """Whether ``line`` sits in a ``for``/``while`` body inside its function (so the function is not one step)."""
    lines = _read(path)
    if lines is None or not 1 <= line <= len(lines):
        return False
    indent = len(_indent(lines[line - 1]))
    for text in reversed(lines[: line - 1]):
        stripped = text.strip()
        if not stripped or stripped.startswith("#") or len(_indent(text)) >= indent:
            continue
        if stripped.startswith(("for ", "while ", "async for ")):
            return True
        if stripped.startswith(("def ", "async def ", "class ")):
            return False
        indent = len(_indent(text))
    return False


def insert_after_block(path: str, first: int, last: int, statement: str) -> str | None:
    """Add ``statement`` after the statement spanning lines ``first``..``last`` (a whole ``if`` with its
    branches, say), at that statement's indentation; ``None`` when the next line already says it."""
    lines = _read(path)
    if lines is None or not 1 <= first <= last <= len(lines):
        return None
    if last < len(lines) and lines[last].strip() == statement.strip():
        return None
    new_line = f"{_indent(lines[first - 1])}{statement}\n"
    return _diff(path, lines, lines[:last] + [new_line] + lines[last:])


def drop_call_kwargs(path: str, line: int, callee: str, names: set[str]) -> str | None:
    """Remove the keyword arguments ``names`` from the ``callee(...)`` call starting on ``line`` (it may span
    lines), with the comma before each."""
    lines = _read(path)
    if lines is None:
        return None
    text = "".join(lines)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    starts = [0]
    for row in lines:
        starts.append(starts[-1] + len(row))

    def offset(row: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return starts[row - 1] + len(lines[row - 1].encode("utf-8")[:col].decode("utf-8", "ignore"))

    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and call.lineno == line and ast.unparse(call.func) == callee):
            continue
        arguments: list[ast.expr | ast.keyword] = sorted(
            [*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset)
        )
        spans = []
        for index, argument in enumerate(arguments):
            if not (isinstance(argument, ast.keyword) and argument.arg in names):
                continue
            end = offset(argument.end_lineno or argument.lineno, argument.end_col_offset or 0)
            if index:  # from the end of the argument before it: drops the comma in between
                before = arguments[index - 1]
                start = offset(before.end_lineno or before.lineno, before.end_col_offset or 0)
            elif index + 1 < len(arguments):  # the first one: up to the next argument
                start, after = offset(argument.lineno, argument.col_offset), arguments[index + 1]
                end = offset(after.lineno, after.col_offset)
            else:
                start = offset(argument.lineno, argument.col_offset)
            spans.append((start, end))
        merged: list[tuple[int, int]] = []
        for start, end in sorted(spans):  # two dropped in a row may share the text between them
            if merged and start <= merged[-1][1]:
                start, end = merged[-1][0], max(end, merged.pop()[1])
            merged.append((start, end))
        for start, end in reversed(merged):
            text = text[:start] + text[end:]
        return _diff(path, lines, text.splitlines(keepends=True)) if spans else None
    return None


def line_text(path: str, line: int) -> str:
    """The source text of ``line`` (empty when unreadable), for messages and pattern checks."""
    lines = _read(path)
    return lines[line - 1].strip() if lines and 1 <= line <= len(lines) else ""


def insert_after_statement(path: str, line: int, statement: str) -> str | None:
    """Add ``statement`` after the statement starting at ``line``, at its indentation (inside the body when
    that statement opens a block, e.g. ``for tokens in loader:``)."""
    lines = _read(path)
    if lines is None or not 1 <= line <= len(lines):
        return None
    end = _statement_end(lines, line - 1)
    indent = _indent(lines[line - 1])
    if lines[end].split("#", 1)[0].rstrip().endswith(":"):
        body = next((text for text in lines[end + 1 :] if text.strip()), "")
        indent = _indent(body) if len(_indent(body)) > len(indent) else indent + "    "
    new_line = f"{indent}{statement}\n"
    if end + 1 < len(lines) and lines[end + 1].strip() == statement.strip():
        return None
    return _diff(path, lines, lines[: end + 1] + [new_line] + lines[end + 1 :])
