"""The building blocks every rule family uses: rule declaration, Python handlers and text fixes.

A family module (``devices``, ``cuda_api``, ...) declares its :class:`~tpu_agent.migrate.model.Rule` objects
as data and registers small handler functions with the libcst node types they look at. The engine runs ONE
libcst pass per file and dispatches each node to the handlers registered for its type, so adding a rule
never adds a parse or a tree walk. Text files (shell, ``.env``, YAML, Dockerfiles) get line-level
:class:`TextFix` objects instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, FileKind, Rule, Safety
from tpu_agent.migrate.rules.references import guide

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext, TextContext

LeaveFn = Callable[["PyContext", Any, Any], Any]
VisitFn = Callable[["PyContext", Any], None]

TEXT_KINDS = frozenset({FileKind.SHELL, FileKind.ENV, FileKind.YAML, FileKind.DOCKERFILE})


@dataclass(frozen=True)
class LeaveHandler:
    """Called on leaving a node of ``node_type``: returns the (possibly) rewritten updated node."""

    node_type: type[cst.CSTNode]
    fn: LeaveFn


@dataclass(frozen=True)
class VisitHandler:
    """Called on entering a node of ``node_type``, before its children: marks nodes for later handlers."""

    node_type: type[cst.CSTNode]
    fn: VisitFn


RefFn = Callable[["PyContext", Any, Any, str], Any]


@dataclass(frozen=True)
class ReferenceHandler:
    """Called on leaving a whole dotted reference (``torch.cuda.synchronize``, an imported alias) whose
    qualified name starts with ``prefix``. Only the handler with the longest matching prefix runs."""

    prefix: str
    fn: RefFn


@dataclass(frozen=True)
class TextFix:
    """A line-level rule for launch scripts and configs.

    ``pattern`` is searched in each line of a file of one of ``kinds``; ``replace`` returns the new text for the
    match (``""`` removes it, ``None`` leaves it: report only). ``drop_line`` removes the whole line when the
    fix applies and the line holds nothing but the match (``export NCCL_DEBUG=INFO``).
    """

    code: str
    kinds: frozenset[FileKind]
    pattern: re.Pattern[str]
    replace: Callable[[TextContext, re.Match[str]], str | None]
    message: Callable[[TextContext, re.Match[str]], str]
    drop_line: bool = False


FileFn = Callable[[bytes], str]


@dataclass(frozen=True)
class WholeFileRule:
    """A rule that judges a whole file of one of ``kinds`` without parsing it (``.cu`` sources: TPU801).

    ``message`` turns the file's bytes into the finding's message; the engine reports one finding at the
    top of the file and never rewrites it.
    """

    code: str
    kinds: frozenset[FileKind]
    message: FileFn


class Family:
    """One rule family: its rules, its Python handlers, its text fixes, its whole-file rules and its claims.

    A *claim* is a call (by qualified name) whose device or backend arguments this family rewrites as a
    whole; the generic device-argument rule (TPU101) leaves claimed calls alone so that one finding, not
    two, is reported per occurrence. Claims are part of the family record, collected by the engine from
    every enabled family, so no rule depends on the order the families are listed in.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.rules: list[Rule] = []
        self.leave_handlers: list[LeaveHandler] = []
        self.visit_handlers: list[VisitHandler] = []
        self.reference_handlers: list[ReferenceHandler] = []
        self.text_fixes: list[TextFix] = []
        self.file_rules: list[WholeFileRule] = []
        self.claims: set[str] = set()

    @property
    def guide(self) -> str:
        """The section of the shipped migration guide that explains this family (cited by every rule)."""
        return guide(self.name)

    def rule(
        self,
        *,
        code: str,
        name: str,
        safety: Safety,
        summary: str,
        rationale: str,
        before: str,
        after: str,
        references: tuple[str, ...],
        since_torch: str | None = None,
        apis: tuple[ApiEquivalent, ...] = (),
        tpu_safety: Safety | None = None,
    ) -> Rule:
        """Declare a rule of this family; the family's guide section is appended to ``references``."""
        rule = Rule(
            code=code,
            name=name,
            family=self.name,
            safety=safety,
            summary=summary,
            rationale=rationale,
            before=before,
            after=after,
            references=(*references, self.guide),
            since_torch=since_torch,
            tpu_safety=tpu_safety,
            apis=apis,
        )
        self.rules.append(rule)
        return rule

    def claim(self, *qualnames: str) -> None:
        """Claim calls whose device/backend arguments this family rewrites itself (see the class docstring)."""
        self.claims.update(qualnames)

    def leave(self, node_type: type[cst.CSTNode]) -> Callable[[LeaveFn], LeaveFn]:
        def register(fn: LeaveFn) -> LeaveFn:
            self.leave_handlers.append(LeaveHandler(node_type, fn))
            return fn

        return register

    def visit(self, node_type: type[cst.CSTNode]) -> Callable[[VisitFn], VisitFn]:
        def register(fn: VisitFn) -> VisitFn:
            self.visit_handlers.append(VisitHandler(node_type, fn))
            return fn

        return register

    def reference(self, *prefixes: str) -> Callable[[RefFn], RefFn]:
        def register(fn: RefFn) -> RefFn:
            self.reference_handlers.extend(ReferenceHandler(prefix, fn) for prefix in prefixes)
            return fn

        return register

    def text(self, fix: TextFix) -> TextFix:
        self.text_fixes.append(fix)
        return fix

    def whole_file(self, code: str, *kinds: FileKind) -> Callable[[FileFn], FileFn]:
        """Register ``fn(data) -> message`` as rule ``code`` for every file of ``kinds`` (never parsed)."""

        def register(fn: FileFn) -> FileFn:
            self.file_rules.append(WholeFileRule(code, frozenset(kinds), fn))
            return fn

        return register
