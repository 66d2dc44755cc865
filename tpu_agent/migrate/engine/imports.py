"""Import bookkeeping after the rules ran: add what the rewrites need, drop what they left unused.

Rules only mark needs on the context (``needs_torch``, ``needs_device``); :func:`finish_module` adds
``import torch`` and the module-level device resolver once, after the leading imports. When the rewrites
leave a CUDA import without a single use, :func:`remove_unused_cuda_imports` drops it, so the output
does not keep ``from torch.cuda import amp`` for nothing.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TypeGuard

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import GatherUnusedImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import GlobalScope, ImportAssignment, MetadataWrapper, Scope, ScopeProvider

from tpu_agent.migrate.analysis.astnodes import nodes
from tpu_agent.migrate.analysis.local_names import bindings_of
from tpu_agent.migrate.engine.context import RESOLVER_COMMENT, PyContext
from tpu_agent.migrate.model import Target

CUDA_MODULE = "torch.cuda"
CUDA_MODULE_PREFIXES = (CUDA_MODULE, "torch.backends.cudnn", "torch.backends.cuda")


def is_import_line(stmt: cst.CSTNode) -> TypeGuard[cst.SimpleStatementLine]:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body
    )


def _imports_only(stmt: cst.CSTNode) -> bool:
    """A ``try:``/``if`` block that only imports (``try: import x / except ImportError: x = None``)."""
    if isinstance(stmt, cst.Try):
        return isinstance(stmt.body, cst.IndentedBlock) and all(is_import_line(s) for s in stmt.body.body)
    if isinstance(stmt, cst.If):
        return isinstance(stmt.body, cst.IndentedBlock) and all(is_import_line(s) for s in stmt.body.body)
    return False


def _binds_torch(stmt: cst.CSTNode, torch_name: str) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Import):
            for alias in small.names:
                name = alias.evaluated_name
                bound = alias.evaluated_alias
                if (bound is None and name.split(".")[0] == torch_name == "torch") or (
                    bound == torch_name and name == "torch"
                ):
                    return True
    return False


def _insertion_index(ctx: PyContext, body: list[cst.BaseStatement]) -> int:
    """After the file's leading imports, and before the first top-level statement that uses the resolver."""
    start = 0
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr):
        if isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
            start = 1
    index = start
    for i in range(start, len(body)):
        stmt = body[i]
        if is_import_line(stmt) or _imports_only(stmt):
            index = i + 1
        elif not isinstance(stmt, cst.SimpleStatementLine):
            break
    if ctx.device_first_top is not None:
        index = min(index, max(ctx.device_first_top, start))
    # never before ``from __future__`` imports
    for i in range(start, len(body)):
        stmt = body[i]
        if is_import_line(stmt) and any(
            isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name) and s.module.value == "__future__"
            for s in stmt.body
        ):
            index = max(index, i + 1)
    return index


def finish_module(ctx: PyContext, original: cst.Module, module: cst.Module) -> tuple[cst.Module, tuple[int, int]]:
    """Add ``import torch`` and the device resolver when the rewrites need them and the file lacks them.

    Returns the module and (index, count) of the statements added.
    """
    need_resolver = ctx.needs_device and ctx.target is Target.ACCELERATOR and not ctx.resolver_exists
    if not (need_resolver or ctx.needs_torch):
        return module, (0, 0)
    body = list(module.body)
    index = _insertion_index(ctx, list(original.body))
    new: list[cst.BaseStatement] = []
    if not any(_binds_torch(stmt, ctx.torch_name) for stmt in original.body[:index]):
        if ctx.torch_name == "torch":
            new.append(cst.parse_statement("import torch\n"))
        else:
            new.append(cst.parse_statement(f"import torch as {ctx.torch_name}\n"))
    if need_resolver:
        t = ctx.torch_name
        resolver = cst.parse_statement(
            f'{ctx.device_name} = {t}.accelerator.current_accelerator(check_available=True) or {t}.device("cpu")\n'
        )
        new.append(
            resolver.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(comment=cst.Comment(RESOLVER_COMMENT))])
        )
    if not new:
        return module, (0, 0)
    return module.with_changes(body=[*body[:index], *new, *body[index:]]), (index, len(new))


@dataclass(frozen=True)
class UnusedImports:
    """CUDA imports the output no longer uses."""

    names: frozenset[str]  # names bound by ``from torch.cuda import amp``-style imports, used nowhere else
    retire_module: bool  # ``import torch.cuda`` whose module is referred to nowhere else

    @property
    def any(self) -> bool:
        return bool(self.names) or self.retire_module


_NONE_UNUSED = UnusedImports(frozenset(), False)


def _is_cuda_module_import(alias: cst.ImportAlias) -> bool:
    """``import torch.cuda`` (or a submodule) without ``as``: it binds ``torch`` as well as the CUDA module."""
    return alias.asname is None and _is_cuda_module(alias.evaluated_name)


def _is_cuda_module(name: str) -> bool:
    return name == CUDA_MODULE or name.startswith(f"{CUDA_MODULE}.")


class _UnusedImportsVisitor(GatherUnusedImportsVisitor):
    """libcst's unused-import analysis (scope references, ``__all__``, names in string annotations), except that
    a plain ``import torch.cuda`` is in use only while something refers to ``torch.cuda`` through it: the
    ``torch`` it also binds stays bound by the ``import torch`` it becomes."""

    def is_in_use(self, scope: Scope, alias: cst.ImportAlias) -> bool:
        if not _is_cuda_module_import(alias):
            return super().is_in_use(scope, alias)
        parts = alias.evaluated_name.split(".")
        modules = [".".join(parts[:end]) for end in range(2, len(parts) + 1)]  # torch.cuda, torch.cuda.amp...
        return any(
            isinstance(assignment, ImportAssignment) and assignment.references
            for module in modules
            for assignment in scope[module]
        )


def _cuda_qualname(alias: cst.ImportAlias, parent: cst.Import | cst.ImportFrom) -> str:
    if isinstance(parent, cst.Import):
        return alias.evaluated_name
    return f"{get_full_name_for_node(parent.module) if parent.module is not None else ''}.{alias.evaluated_name}"


def unused_cuda_imports(ctx: PyContext, code: str) -> UnusedImports:
    """What :func:`remove_unused_cuda_imports` would drop from ``code`` (the output text).

    Whether an import is still used is decided by real references (libcst's scope analysis of the output): a
    name that a comment, a string or a docstring still mentions is unused all the same. The analysis parses the
    output again, so it only runs when the text leaves a doubt: a name its text never repeats is unused."""
    names = {
        name for name, qualname in ctx.aliases.items() if qualname.startswith(CUDA_MODULE_PREFIXES) and name != "torch"
    }
    maybe_used = {name for name in names if len(re.findall(rf"(?<![\w.]){re.escape(name)}\b", code)) > 1}
    plain_imports = len(re.findall(r"^import[ \t]+torch\.cuda\b", code, re.MULTILINE))
    module_mentioned = ctx.imports_cuda_module and len(re.findall(r"\btorch\.cuda\b", code)) > plain_imports
    if not maybe_used and not module_mentioned:
        return UnusedImports(frozenset(names), ctx.imports_cuda_module)
    if not module_mentioned and not ctx.imports_cuda_module and _surely_read(code, maybe_used):
        return UnusedImports(frozenset(names - maybe_used), False)  # what the scope analysis would find
    try:
        wrapper = MetadataWrapper(cst.parse_module(code), unsafe_skip_copy=True)
    except cst.ParserSyntaxError:
        return _NONE_UNUSED  # the output does not parse: leave the imports alone
    wrapper.resolve_many(_UnusedImportsVisitor.METADATA_DEPENDENCIES)
    visitor = _UnusedImportsVisitor(CodemodContext(wrapper=wrapper))
    wrapper.module.visit(visitor)
    unused_names, retire_module = names - maybe_used, False
    for alias, parent in visitor.unused_imports:
        if not isinstance(visitor.get_metadata(ScopeProvider, parent), GlobalScope):
            continue  # only module-level imports are removed
        if _is_cuda_module_import(alias):
            retire_module = True
        elif _cuda_qualname(alias, parent).startswith(CUDA_MODULE_PREFIXES):
            bound = _bound_name(alias)
            if bound in names:
                unused_names.add(bound)
    return UnusedImports(frozenset(unused_names), retire_module)


def _surely_read(code: str, names: set[str]) -> bool:
    """Whether the stdlib parse of ``code`` proves that libcst's scope analysis finds every one of ``names`` in
    use, so that analysis (a second libcst parse plus scope metadata: seconds on a long test file) can be skipped.

    The proof is deliberately narrow: each name is bound exactly once in the whole module, by an import, and is
    read (a ``Name`` load) on a line after that import, so every read resolves to that import whatever scope it
    is in. Anything else -- a second binding anywhere (assignment, parameter, ``global``, another import), a read
    only before or beside the import, a plain ``import torch.cuda`` (its use is judged differently), a text the
    stdlib parser rejects -- answers False and the caller runs the full analysis."""
    if not names or not all(name.isidentifier() for name in names):
        return False
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    imported: dict[str, list[int]] = {}  # name -> last line of each import binding it
    bound_otherwise: set[str] = set()
    read_on: dict[str, int] = {}  # name -> last line it is read on
    for node in nodes(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            read_on[node.id] = max(read_on.get(node.id, 0), node.lineno)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if isinstance(node, ast.Import) and alias.asname is None and _is_cuda_module(alias.name):
                    return False
                bound = alias.asname or alias.name.split(".")[0]
                imported.setdefault(bound, []).append(node.end_lineno or node.lineno)
        else:
            bound_otherwise.update(bindings_of(node))
    for name in names:
        lines = imported.get(name, [])
        if name in bound_otherwise or len(lines) != 1 or read_on.get(name, 0) <= lines[0]:
            return False
    return True


def remove_unused_cuda_imports(module: cst.Module, code: str, found: UnusedImports) -> str:
    """Drop ``from torch.cuda import amp``-style aliases the rewrites left without a single use, and turn
    ``import torch.cuda`` into ``import torch`` once no ``torch.cuda`` is left (``found``)."""
    unused, retire_module = found.names, found.retire_module
    if not found.any:
        return code
    body = []
    changed = False
    for stmt in module.body:
        if is_import_line(stmt):
            smalls = []
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                    keep = []
                    for alias in small.names:
                        if _bound_name(alias) in unused and not (
                            isinstance(small, cst.Import) and alias.asname is None
                        ):
                            continue
                        if (
                            retire_module
                            and isinstance(small, cst.Import)
                            and alias.asname is None
                            and _is_cuda_module_import(alias)
                        ):
                            alias = alias.with_changes(name=cst.Name("torch"))
                        keep.append(alias)
                    if keep != list(small.names):
                        changed = True
                        if not keep:
                            continue
                        keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                        small = small.with_changes(names=keep)
                        if isinstance(small, cst.ImportFrom) and small.lpar is not None and len(keep) == 1:
                            small = small.with_changes(lpar=None, rpar=None)
                smalls.append(small)
            if not smalls:
                continue
            stmt = stmt.with_changes(body=smalls)
        body.append(stmt)
    return module.with_changes(body=body).code if changed else code


def _bound_name(alias: cst.ImportAlias) -> str:
    bound = alias.evaluated_alias
    return bound if bound is not None else alias.evaluated_name.split(".")[0]
