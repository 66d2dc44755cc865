"""docs/torchtpu-fidelity.md cannot drift: every row says what the emulation does, and the tests it names exist.

The table is the project's promise about TorchTPU's documented behaviours; a row whose test was renamed or deleted
would be a promise nothing checks any more. Read as text: nothing is imported or run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "torchtpu-fidelity.md"
HEADERS = ("| Documented behaviour |", "| Pitfall |")
REFERENCE = re.compile(r"`(tests/[^`:]+)(?:::([A-Za-z_][A-Za-z0-9_]*))?`")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def rows(text: str) -> list[tuple[int, list[str]]]:
    """(line number, cells) of every row of the behaviour and pitfall tables; each has a Checked by column."""
    found, header = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith(HEADERS):
            header = _cells(line)
            assert header[-1] == "Checked by", f"line {number}: the table has no Checked by column"
        elif header and line.startswith("|---"):
            continue
        elif header and line.startswith("| "):
            cells = _cells(line)
            assert len(cells) == len(header), f"line {number}: {len(cells)} cells for {len(header)} columns"
            found.append((number, cells))
        else:
            header = None
    return found


def problems(text: str, repo: Path) -> list[str]:
    """What is wrong with the tables: unknown rows, rows naming no test, names that do not exist."""
    wrong = []
    for number, cells in rows(text):
        behaviour, emulation, checked = cells[0], cells[1], cells[-1]
        if any(re.search(r"\bunknown\b", cell, re.IGNORECASE) for cell in cells):
            wrong.append(f"line {number}: a cell is left unknown")
        references = REFERENCE.findall(checked)
        if not references and not emulation.startswith("n/a"):
            wrong.append(f"line {number}: {behaviour[:60]!r} is reproduced but names no test or fixture")
        for path, name in references:
            target = repo / path
            if not target.is_file():
                wrong.append(f"line {number}: {path} does not exist")
            elif name and not re.search(rf"^\s*def {name}\(", target.read_text(encoding="utf-8"), re.MULTILINE):
                wrong.append(f"line {number}: {path} has no test {name}")
    return wrong


def test_every_row_says_what_happens_and_names_tests_that_exist() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert len(rows(text)) > 100  # every notebook's table and the pitfalls were read
    assert problems(text, REPO) == []


@pytest.mark.parametrize(
    ("row", "complaint"),
    [
        ("| x | same | - | - | - |", "names no test"),
        ("| x | unknown | - | - | `tests/runtime/test_fidelity_table.py` |", "left unknown"),
        ("| x | same | - | - | `tests/nowhere.py` |", "tests/nowhere.py does not exist"),
        ("| x | same | - | - | `tests/runtime/test_fidelity_table.py::test_gone` |", "has no test test_gone"),
    ],
)
def test_a_broken_row_is_named_with_its_line(row: str, complaint: str) -> None:
    table = "| Documented behaviour | Emulation | migrate | profile / check | Checked by |\n|---|---|---|---|---|\n"
    (problem,) = problems(table + row + "\n", REPO)
    assert problem.startswith("line 3: ") and complaint in problem
