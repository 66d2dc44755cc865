"""Migrating one file: read, gate, decode, run the right adapter, and describe the result.

This is the unit of work of the process pool, so it takes plain data (a :class:`Candidate`, options, the
file's bytes) and returns a :class:`FileResult`; every failure that is the file's fault becomes a
``skipped_reason`` naming the file and line, never an exception.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections.abc import Callable
from functools import lru_cache

from tpu_agent.migrate.engine.discovery import Candidate
from tpu_agent.migrate.engine.dispatch import Dispatch
from tpu_agent.migrate.engine.guard import (
    IsolationFailure,
    ParseFailure,
    SourceProblem,
    assess,
    process_context,
    run_isolated,
)
from tpu_agent.migrate.engine.notebook import NotebookError, migrate_notebook
from tpu_agent.migrate.engine.prefilter import may_need_migration
from tpu_agent.migrate.engine.pypass import Imported, PyOutcome, migrate_source
from tpu_agent.migrate.engine.textfiles import migrate_text
from tpu_agent.migrate.model import FileKind, FileResult, Finding, MigrateOptions, sha256_bytes
from tpu_agent.migrate.rules import ALL_RULES, FAMILIES
from tpu_agent.migrate.rules._base import TextFix, WholeFileRule

ISOLATED_RECURSION_LIMIT = 20_000


@lru_cache(maxsize=1)
def dispatch() -> Dispatch:
    return Dispatch.from_families(list(FAMILIES))


@lru_cache(maxsize=1)
def text_fixes() -> tuple[TextFix, ...]:
    return tuple(fix for family in FAMILIES for fix in family.text_fixes)


@lru_cache(maxsize=1)
def whole_file_rules() -> dict[FileKind, tuple[WholeFileRule, ...]]:
    """Per file kind, the rules that judge a whole file of it without parsing (``.cu`` sources)."""
    by_kind: dict[FileKind, list[WholeFileRule]] = {}
    for family in FAMILIES:
        for rule in family.file_rules:
            for kind in rule.kinds:
                by_kind.setdefault(kind, []).append(rule)
    return {kind: tuple(rules) for kind, rules in by_kind.items()}


def count_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _findings(
    outcome: PyOutcome, display_path: str, where: Callable[[int], tuple[int, int]] | None = None
) -> list[Finding]:
    """Findings with 1-based positions; ``where`` maps a joined-notebook line to (cell, line in cell)."""
    out = []
    for placed in outcome.findings:
        line, col, end_line, end_col = placed.position
        message = placed.message
        if where is not None:
            cell, line_in_cell = where(line)
            _, end_in_cell = where(end_line)
            message = f"cell {cell}: {message}"
            line, end_line = line_in_cell, end_in_cell
        out.append(
            Finding(
                placed.code, display_path, line, col + 1, message, placed.safety, placed.fixed, end_line, end_col + 1
            )
        )
    return out


class EncodingCookieError(Exception):
    """A PEP 263 cookie names an unknown encoding, or contradicts a BOM."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


def _decode(data: bytes) -> tuple[str, str]:
    """The file's encoding (BOM, PEP 263 cookie, else UTF-8) and its text."""
    try:
        encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
    except SyntaxError as exc:  # detect_encoding reports a bad cookie as SyntaxError
        raise EncodingCookieError(str(exc), getattr(exc, "lineno", None) or 1) from exc
    try:
        return encoding, data.decode(encoding)
    except LookupError as exc:
        raise EncodingCookieError(str(exc), 1) from exc


def _run_python(source: str, options: MigrateOptions, imported: Imported | None = None) -> PyOutcome:
    """Migrate a Python text in-process when the stdlib parser finds it ordinary, else in a sacrificial process
    under the per-file time budget (:mod:`~tpu_agent.migrate.engine.guard`). ``imported``: what other modules
    do with this module's constants (:mod:`~tpu_agent.migrate.analysis.crossmodule`)."""
    assessment = assess(source)
    try:
        if not assessment.isolate:
            outcome = migrate_source(source, options, ALL_RULES, dispatch(), assessment.tree, imported)
        else:
            args = (source, options, imported)
            outcome = run_isolated(_run_in_isolation, args, options.file_budget_s, process_context())
    except ParseFailure as exc:  # libcst's positions are rough where the stdlib parser gave one
        raise assessment.error or exc from None  # the stdlib parser places syntax errors more exactly
    except IsolationFailure as exc:
        raise IsolationFailure(f"{exc} on {assessment.reason}", assessment.line) from None
    if assessment.tree is not None and outcome.code is not None:
        _check_output(outcome.code, outcome.generated)
    return outcome


class InvalidOutput(Exception):
    """The rewrite of a text the stdlib parser accepts is no Python: a rule's bug (an expression written where
    an assignment target stood). Raised, not written: the file is reported as an internal error and left as
    it was, where writing it would break a working program."""


def _check_output(code: str, generated: list[tuple[int, str]] | None = None) -> None:
    """Parse the rewrite: all of it, or only its ``generated`` parts (offset, text) where the rest is copied from
    the source, which parsed. Each part is whole top-level statements, so it parses alone exactly when it parses
    in its place; parsing only the parts saves most of the parse in a file where few statements changed."""
    for offset, text in generated if generated is not None else [(0, code)]:
        try:
            ast.parse(text)
        except SyntaxError as exc:
            line = code.count("\n", 0, offset) + (exc.lineno or 1)
            raise InvalidOutput(f"the rewrite does not parse at line {line}: {exc.msg}") from None


def _run_in_isolation(source: str, options: MigrateOptions, imported: Imported | None = None) -> PyOutcome:
    """What the sacrificial process runs: the whole migration of one text (the caller already assessed it).

    libcst's visitors recurse once per tree level; the process exists to absorb deep trees, so it allows the
    recursion that the in-process path must not risk (a stack overflow here costs only this process).
    """
    sys.setrecursionlimit(max(sys.getrecursionlimit(), ISOLATED_RECURSION_LIMIT))
    return migrate_source(source, options, ALL_RULES, dispatch(), imported=imported)


def migrate_file(candidate: Candidate, data: bytes, options: MigrateOptions) -> FileResult:
    result = FileResult(
        path=candidate.path,
        display_path=candidate.display_path,
        kind=candidate.kind,
        original_sha256=sha256_bytes(data),
        lines=count_lines(data),
    )
    where = candidate.display_path
    if candidate.skipped_reason:
        result.skipped_reason = candidate.skipped_reason
        return result
    file_rules = whole_file_rules().get(candidate.kind)
    if file_rules is not None:
        for rule in file_rules:
            if options.rule_enabled(rule.code):
                safety = ALL_RULES[rule.code].safety_for(options.target)
                result.findings.append(Finding(rule.code, where, 1, 1, rule.message(data), safety, False))
        return result
    if not may_need_migration(data):
        result.prefiltered = True
        return result
    try:
        if candidate.kind is FileKind.PYTHON:
            encoding, source = _decode(data)
            outcome = _run_python(source, options, candidate.imported_flows)
            result.findings = _findings(outcome, where)
            if outcome.code is not None:
                result.migrated_bytes = outcome.code.encode(encoding)
        elif candidate.kind is FileKind.NOTEBOOK:
            new, outcome, cell_of = migrate_notebook(data, lambda text: _run_python(text, options))
            result.findings = _findings(outcome, where, cell_of)
            result.migrated_bytes = new
        else:
            result.migrated_bytes, result.findings = migrate_text(
                data, candidate.kind, where, options, ALL_RULES, text_fixes()
            )
    except ParseFailure as exc:
        result.skipped_reason = f"{where}:{exc.line}:{exc.column}: does not parse as Python 3 ({exc})"
        result.findings = []
    except SourceProblem as exc:
        result.skipped_reason = f"{where}:{exc.line}: skipped: {exc}; migrate this file by hand or simplify that code"
        result.findings = []
    except RecursionError:
        result.skipped_reason = f"{where}: skipped: nested too deeply for the rewrite; migrate this file by hand"
        result.findings, result.migrated_bytes = [], None
    except UnicodeDecodeError as exc:
        result.skipped_reason = f"{where}:{_line_of(data, exc.start)}: undecodable bytes ({exc.reason}, {exc.encoding})"
    except EncodingCookieError as exc:
        result.skipped_reason = f"{where}:{exc.line}: {exc}"
    except NotebookError as exc:
        result.skipped_reason = f"{where}: {exc}"
    except Exception as exc:  # a bug in a rule must not stop the other files; say so plainly
        result.skipped_reason = (
            f"{where}: tpu-agent internal error ({type(exc).__name__}: {exc}); the file is left unchanged, "
            "please report it with this file"
        )
        result.findings, result.migrated_bytes = [], None
    return result
