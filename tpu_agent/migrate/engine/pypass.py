"""Migrating one Python source text: parse, gate, run the rule pass, place the findings, write the output.

This module only orchestrates; each job lives in its own module:

* :mod:`~tpu_agent.migrate.engine.gate` -- which statements hold no trigger and are neither parsed nor visited;
* :mod:`~tpu_agent.migrate.engine.rulepass` (with :mod:`~tpu_agent.migrate.engine.dispatch`) -- the one
  libcst pass per file that runs the rule handlers;
* :mod:`~tpu_agent.migrate.engine.imports` -- imports added for and left unused by the rewrites;
* :mod:`~tpu_agent.migrate.engine.positions` -- where the findings are, computed after the pass and only
  for the nodes that have findings;
* :mod:`~tpu_agent.migrate.engine.splice` -- the output text, copying untouched statements from the source.

:func:`rewrite` (parse, gate, pass) is the seam the tests use to check the pieces against libcst's own
code generation; :func:`migrate_source` is what the engine calls.
"""

from __future__ import annotations

import ast
import gc
from collections.abc import Mapping
from dataclasses import dataclass, field

import libcst as cst

from tpu_agent.migrate.engine.context import Imported, PyContext
from tpu_agent.migrate.engine.dispatch import Dispatch
from tpu_agent.migrate.engine.gate import StatementMap, reduce_source, statement_map
from tpu_agent.migrate.engine.guard import ParseFailure
from tpu_agent.migrate.engine.imports import remove_unused_cuda_imports, unused_cuda_imports
from tpu_agent.migrate.engine.positions import Layout, Position, layout, positions, statement_positions
from tpu_agent.migrate.engine.rulepass import Edits, RulePass
from tpu_agent.migrate.engine.splice import same_lines, splice
from tpu_agent.migrate.model import MigrateOptions, Rule, Safety

__all__ = ["Imported", "ParseFailure", "PlacedFinding", "PyOutcome", "Rewrite", "migrate_source", "parse", "rewrite"]


@dataclass
class Rewrite:
    """One run of the rules over a module, before positions and output text are worked out."""

    source: str
    module: cst.Module  # as parsed
    new_module: cst.Module  # after the rules
    ctx: PyContext  # the findings and what the rules needed
    statements: StatementMap
    edits: Edits
    # the module was parsed from ``source`` with its inert statements stubbed (:func:`gate.reduce_source`): its
    # code is not the file's, so the output must be spliced from ``source``
    reduced: bool = False


@dataclass(frozen=True)
class PlacedFinding:
    """A finding with its position, free of libcst nodes (so an outcome can cross a process boundary)."""

    code: str
    message: str
    safety: Safety
    fixed: bool
    position: Position  # 1-based line, 0-based column of start and end


@dataclass
class PyOutcome:
    """The result of migrating one Python source text."""

    code: str | None  # None when nothing changes
    findings: list[PlacedFinding] = field(default_factory=list)
    # (offset, text) of the parts of ``code`` that were generated, the rest being copied from the source text;
    # None when all of it was generated
    generated: list[tuple[int, str]] | None = None


def parse(source: str) -> cst.Module:
    """The libcst module of ``source``; :class:`ParseFailure` when it does not parse."""
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise ParseFailure(exc.message, exc.raw_line, exc.raw_column + 1) from exc


def rewrite(
    source: str,
    options: MigrateOptions,
    rules: Mapping[str, Rule],
    dispatch: Dispatch,
    tree: ast.Module | None = None,
    reduce: bool = False,
    imported: Imported | None = None,
) -> Rewrite:
    """Parse ``source`` and run every enabled rule over it in one pass (statements the gate marks inert are
    not visited; with ``reduce``, inert top-level statements are not even parsed by libcst). ``tree`` is the
    stdlib parse of ``source`` when the caller already made it."""
    reduction = reduce_source(source, tree) if reduce and tree is not None else None
    module = parse(reduction.text if reduction is not None else source)
    if reduction is not None:
        statements = statement_map(module, reduction.text, reduction.tree)
        statements.tree = tree  # the analyses (value flow) see every use, the stubbed statements' included
    else:
        statements = statement_map(module, source, tree)
    ctx = PyContext.for_source(source, options, rules, dispatch.claimed_calls, statements.tree)
    ctx.imported_flows = imported or {}
    transformer = RulePass(ctx, dispatch)
    transformer.inert = ctx.inert_statements = statements.inert
    ctx.module_body, ctx.reduced = module.body, reduction is not None
    new_module = module.visit(transformer)
    return Rewrite(source, module, new_module, ctx, statements, transformer.edits, reduction is not None)


def migrate_source(
    source: str,
    options: MigrateOptions,
    rules: Mapping[str, Rule],
    dispatch: Dispatch,
    tree: ast.Module | None = None,
    imported: Imported | None = None,
) -> PyOutcome:
    """Run the rules over ``source``; raise :class:`ParseFailure` when it does not parse.

    libcst parses only the statements the rules can act on (:func:`gate.reduce_source`); in the rare case
    that the output cannot be spliced from the original text (a top-level statement removed), or that a rule
    needs to read a statement the reduction stubbed, the file is migrated again from its full parse. CUDA imports
    the rewrite left unused are dropped from a parse of the spliced output."""
    # Parsing and the pass allocate many short-lived, acyclic nodes: the cyclic collector only slows them down.
    collecting = gc.isenabled()
    gc.disable()
    try:
        outcome = _outcome(rewrite(source, options, rules, dispatch, tree, reduce=True, imported=imported))
        if outcome is None:
            outcome = _outcome(rewrite(source, options, rules, dispatch, tree, imported=imported))
        assert outcome is not None  # a module parsed in full always has an outcome
        return outcome
    finally:
        if collecting:
            gc.enable()


def _outcome(result: Rewrite) -> PyOutcome | None:
    """Place the findings and produce the output text, splicing when the statement layout allows it; None for
    a reduced module whose output needs code generation of the whole module."""
    module, new_module, ctx, edits = result.module, result.new_module, result.ctx, result.edits
    if result.reduced and ctx.needs_full_parse:
        return None
    begins = result.statements.begins
    placed = layout(module, result.source, begins) if begins is not None else None
    found: dict[int, Position] = {}
    code: str | None = None
    generated: list[tuple[int, str]] | None = None
    if placed is not None:
        found, lengths = statement_positions(module, placed, ctx.findings, edits.dirty)
        if _can_splice(result, placed, lengths):
            code, generated = splice(result.source, module, new_module, placed.spans, edits)
        elif result.reduced and edits.changed:
            return None
    elif result.reduced:
        return None
    elif ctx.findings:
        found, _ = positions(module, [f.node for f in ctx.findings])
    placed_findings = (
        PlacedFinding(f.code, f.message, f.safety, f.fixed, found.get(id(f.node), (1, 0, 1, 0))) for f in ctx.findings
    )
    ordered = sorted(placed_findings, key=lambda f: (f.position[:2], f.code))
    if not edits.changed:
        return PyOutcome(None, ordered)
    if code is None:
        code = new_module.code
    if code != result.source:
        unused = unused_cuda_imports(ctx, code)
        if unused.any and result.reduced:
            # the reduced module holds stubs where the output has code: the imports are dropped from a parse of the
            # spliced output, which is the full module's output (one parse, not a second parse and rule pass)
            try:
                new_module = parse(code)
            except ParseFailure:
                return None
        trimmed = remove_unused_cuda_imports(new_module, code, unused)
        if trimmed is not code:
            code, generated = trimmed, None
    return PyOutcome(code if code != result.source else None, ordered, generated)


def _can_splice(result: Rewrite, placed: Layout, lengths: dict[int, int]) -> bool:
    """Splicing is exact only when the header is unchanged and the layout read off line numbers matches what
    libcst generates for every changed statement (:func:`splice` generates a changed footer itself)."""
    module, new_module, edits = result.module, result.new_module, result.edits
    if not edits.changed:
        return False
    if not same_lines(module.header, new_module.header):
        return False
    for top in edits.dirty:
        start, end = placed.spans[id(module.body[top])]
        length = lengths.get(top)
        if length is None:
            length = len(module.code_for_node(module.body[top]))
        if length != end - start:
            return False
    return True
