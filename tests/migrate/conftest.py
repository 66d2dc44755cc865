"""Shared helpers for the migrate engine tests: fixture pairs and a one-call migration of a source text.

Fixture inputs are named ``<CODE>_<name>.in.<ext>``. Each *variant* of an input is one set of options, named
by flags (``tpu`` target, ``unsafe`` fixes, ``annotate``), and has its expected results next to the input:
``<CODE>_<name>[.<flag>...].findings.json`` with every finding's line, column, code and whether it is fixed,
and ``<CODE>_<name>[.<flag>...].out.<ext>`` when the file changes (no ``.out`` means it must stay
byte-identical). So one input serves every variant; an input that only makes sense for one variant may
carry that variant's flags itself (``<CODE>_<name>.tpu.in.py``). ``TPU_AGENT_REGEN_FIXTURES=1 pytest
tests/migrate/test_rules.py`` rewrites the expected files from the current engine, for review with ``git diff``;
a new variant of an input starts as an empty ``....findings.json`` to regenerate.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tpu_agent.migrate.engine import build_plan
from tpu_agent.migrate.model import FileResult, MigrateOptions, Target

FIXTURES = Path(__file__).parent / "fixtures"
REGEN = os.environ.get("TPU_AGENT_REGEN_FIXTURES") == "1"


@dataclass(frozen=True)
class FixtureCase:
    source: Path
    stem: str  # everything before ".in."
    ext: str
    flags: frozenset[str]

    @property
    def code(self) -> str:
        return self.stem.split("_", 1)[0]

    @property
    def expected_output(self) -> Path:
        return FIXTURES / f"{self.stem}.out.{self.ext}"

    @property
    def expected_findings(self) -> Path:
        return FIXTURES / f"{self.stem}.findings.json"

    def options(self) -> MigrateOptions:
        return MigrateOptions(
            target=Target.TPU if "tpu" in self.flags else Target.ACCELERATOR,
            unsafe_fixes="unsafe" in self.flags,
            annotate="annotate" in self.flags,
            jobs=1,
        )


def fixture_cases() -> list[FixtureCase]:
    """Every (input, variant) pair: a variant is a ``.findings.json`` whose stem is the input's stem, or the
    input's stem plus flags."""
    inputs = {path.name.split(".in.", 1)[0]: path for path in FIXTURES.glob("*.in.*")}
    cases = []
    for expected in sorted(FIXTURES.glob("*.findings.json")):
        stem = expected.name.removesuffix(".findings.json")
        base, *flags = stem.split(".")
        source = inputs.get(stem) or inputs.get(base)
        assert source is not None, f"{expected.name}: no input {base}.in.<ext> or {stem}.in.<ext>"
        cases.append(FixtureCase(source, stem, source.name.split(".in.", 1)[1], frozenset(flags)))
    orphans = set(inputs.values()) - {case.source for case in cases}
    assert not orphans, f"inputs without expected findings: {sorted(p.name for p in orphans)}"
    return cases


def finding_rows(result: FileResult) -> list[list[object]]:
    return [[f.line, f.column, f.code, f.fixed] for f in result.findings]


def migrate_one(path: Path, **options: object) -> FileResult:
    """Plan one file with the engine (jobs=1 unless given) and return its result."""
    options.setdefault("jobs", 1)
    plan = build_plan([path], MigrateOptions(**options))  # type: ignore[arg-type]
    assert len(plan.files) == 1
    return plan.files[0]


def regenerate(case: FixtureCase, result: FileResult) -> None:
    if result.migrated_bytes is not None:
        case.expected_output.write_bytes(result.migrated_bytes)
    elif case.expected_output.exists():
        case.expected_output.unlink()
    case.expected_findings.write_text(json.dumps(finding_rows(result)) + "\n")


@pytest.fixture
def write(tmp_path: Path):  # noqa: ANN201
    """Write ``text`` (str or bytes) to ``tmp_path/name`` and return the path."""

    def _write(name: str, text: str | bytes) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, str):
            path.write_text(text, encoding="utf-8", newline="")
        else:
            path.write_bytes(text)
        return path

    return _write
