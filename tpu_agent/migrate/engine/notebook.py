"""Jupyter notebooks: the code cells are migrated as one module; outputs, metadata and magics stay as they are.

Cells are joined with marker comments (so imports in one cell resolve names in the next and the device
resolver lands once, after the imports), ``%``/``!`` magic lines are masked as ``pass`` placeholders with the
same indentation, and cells of non-Python ``%%`` magics (``%%bash``...) are left out entirely. After the pass the text is split back at the
markers, magics are restored, and only changed cells get new ``source``. The JSON is written back in the
notebook's own layout when that layout can be reproduced exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_agent.migrate.engine.guard import SourceProblem
from tpu_agent.migrate.engine.pypass import PyOutcome

_MARKER = "# tpu-agent-cell {}\n"
_MARKER_RE = re.compile(r"^# tpu-agent-cell (\d+)\r?\n", re.MULTILINE)
_MAGIC_RE = re.compile(r"^([ \t]*)(?:[%!]|\w+[ \t]*=[ \t]*!)")
_CELL_MAGIC_RE = re.compile(r"\s*%%(\w+)")
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug"})  # their body is Python
_PLACEHOLDER = "{}pass  # tpu-agent-magic {}"
_PLACEHOLDER_RE = re.compile(r"^[ \t]*pass  # tpu-agent-magic (\d+)$", re.MULTILINE)


@dataclass
class _Cell:
    index: int  # position in nb["cells"]
    start_line: int  # first line of the cell's code in the joined text (after its marker)
    added_newline: bool


class NotebookError(Exception):
    """The file is not a notebook this tool can read (invalid JSON, no cells)."""


def _source_text(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _layouts(data: bytes, nb: Any) -> tuple[int | None, bool, bool] | None:
    """The json.dumps settings that reproduce ``data`` exactly, if any."""
    text = data.decode("utf-8")
    for indent in (1, 2, 4, None):
        for ensure_ascii in (False, True):
            dumped = json.dumps(nb, indent=indent, ensure_ascii=ensure_ascii)
            if text == dumped + "\n":
                return indent, ensure_ascii, True
            if text == dumped:
                return indent, ensure_ascii, False
    return None


def migrate_notebook(
    data: bytes, migrate: Callable[[str], PyOutcome]
) -> tuple[bytes | None, PyOutcome, Callable[[int], tuple[int, int]]]:
    """Migrate the code cells; returns new bytes (or None), the outcome and a map joined line -> (cell, line)."""
    try:
        nb = json.loads(data.decode("utf-8"))
        cells = nb["cells"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise NotebookError(f"not a readable notebook: {exc}") from exc
    magics: list[str] = []
    pieces: list[str] = []
    layout: list[_Cell] = []
    line = 1
    for index, cell in enumerate(cells):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        text = _source_text(cell)
        cell_magic = _CELL_MAGIC_RE.match(text)
        if cell_magic and cell_magic.group(1) not in _PYTHON_CELL_MAGICS:
            continue  # %%bash, %%writefile...: not Python
        masked_lines = []
        for source_line in text.splitlines(keepends=True):
            match = _MAGIC_RE.match(source_line)
            if match:
                body = source_line.rstrip("\r\n")
                masked_lines.append(_PLACEHOLDER.format(match.group(1), len(magics)) + source_line[len(body) :])
                magics.append(body)
            else:
                masked_lines.append(source_line)
        masked = "".join(masked_lines)
        added = bool(masked) and not masked.endswith("\n")
        if added:
            masked += "\n"
        pieces.append(_MARKER.format(index) + masked)
        layout.append(_Cell(index, line + 1, added))
        line += 1 + masked.count("\n")
    joined = "".join(pieces)

    def where(joined_line: int) -> tuple[int, int]:
        cell = layout[0]
        for candidate in layout:
            if candidate.start_line <= joined_line:
                cell = candidate
        return cell.index + 1, joined_line - cell.start_line + 1

    if not layout:
        return None, PyOutcome(None, []), where
    try:
        outcome = migrate(joined)
    except SourceProblem as exc:  # a position in the joined text: say which cell, and the line in that cell
        cell_no, cell_line = where(exc.line)
        raise exc.relocated(f"cell {cell_no}", cell_line) from exc
    if outcome.code is None:
        return None, outcome, where
    restored = _PLACEHOLDER_RE.sub(lambda m: magics[int(m.group(1))], outcome.code)
    parts = _MARKER_RE.split(restored)
    # parts = [text before the first marker, index, text, index, text, ...]
    prefix, changed = parts[0], False
    by_index = {cell.index: cell for cell in layout}
    for i in range(1, len(parts), 2):
        index = int(parts[i])
        text = parts[i + 1]
        if i == 1:
            text = prefix + text  # code inserted above the first marker belongs to the first cell
        if by_index[index].added_newline and text.endswith("\n"):
            text = text[:-1]
        cell = cells[index]
        if text != _source_text(cell):
            cell["source"] = text.splitlines(keepends=True) if isinstance(cell.get("source"), list) else text
            changed = True
    if not changed:
        return None, outcome, where
    original_layout = _layouts(data, json.loads(data.decode("utf-8")))
    indent, ensure_ascii, trailing = original_layout or (1, False, True)
    dumped = json.dumps(nb, indent=indent, ensure_ascii=ensure_ascii) + ("\n" if trailing else "")
    return dumped.encode("utf-8"), outcome, where
