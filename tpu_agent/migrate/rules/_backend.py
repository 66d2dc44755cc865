"""Process-group backend expressions written for CUDA, and what each becomes (TPU401's classifier).

One classifier serves every place a backend is written: the call (``init_process_group(backend=...)``, an
unpacked ``**{"backend": ...}``) and the definition (``backend = ...``, an argparse default, a config field).
Public training code chooses its backend in a handful of spellings: ``"nccl"``, ``Backend.NCCL``, the combined
``"cuda:nccl,cpu:gloo"`` (speedruns, for CPU-side object collectives), a conditional on an availability check
(``"nccl" if dist.is_nccl_available() else "gloo"``, either way round), a user's flag choosing the NCCL branch,
and an environment override with an NCCL default (``os.environ.get("BACKEND", "nccl")``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from tpu_agent.migrate.rules._cst import source, string_value

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

BACKEND_NCCL = ("torch.distributed.Backend.NCCL", "torch.distributed.distributed_c10d.Backend.NCCL")
NCCL_AVAILABLE = frozenset(
    {"torch.distributed.is_nccl_available", "torch.distributed.distributed_c10d.is_nccl_available"}
)
# checks that hold where NCCL runs: a conditional on one means 'the accelerator's backend, else gloo'
BACKEND_CHECKS = frozenset({"torch.cuda.is_available", "torch.accelerator.is_available", *NCCL_AVAILABLE})
_ENV_READS = frozenset({"os.environ.get", "os.getenv"})
_MIXED_RE = re.compile(r"(?:\w+:\w+,)*cuda:nccl(?:,\w+:\w+)*")
OMITTED_NOTE = " (omitted: torch then creates cpu:gloo plus the accelerator's default backend)"


class BackendRewrite(NamedTuple):
    """The replacement of a backend expression: ``value`` None means 'the default' (the argument omitted at a
    call, ``None`` where a value must stand); ``note`` is added to the finding's message."""

    value: cst.BaseExpression | None
    note: str = ""


def is_nccl(ctx: PyContext, node: cst.CSTNode) -> bool:
    """``"nccl"`` or ``Backend.NCCL``."""
    return string_value(node) == "nccl" or ctx.qualname(node) in BACKEND_NCCL


def _mixed(node: cst.CSTNode) -> str | None:
    value = string_value(node)
    return value if value is not None and _MIXED_RE.fullmatch(value) else None


def _plain(ctx: PyContext, node: cst.CSTNode) -> bool:
    return is_nccl(ctx, node) or _mixed(node) is not None


def check_branches(ctx: PyContext, node: cst.CSTNode) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(the branch taken where NCCL runs, the other) of a conditional on an availability check (``X if
    torch.cuda.is_available() else Y``, ``Y if not dist.is_nccl_available() else X``), else None."""
    if not isinstance(node, cst.IfExp):
        return None
    test = node.test
    negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
    inner = test.expression if isinstance(test, cst.UnaryOperation) and negated else test
    if not (isinstance(inner, cst.Call) and not inner.args and ctx.qualname(inner) in BACKEND_CHECKS):
        return None
    return (node.orelse, node.body) if negated else (node.body, node.orelse)


def check_call(node: cst.IfExp) -> cst.Call:
    """The availability call of a conditional :func:`check_branches` accepted (claimed as part of it)."""
    test = node.test
    inner = test.expression if isinstance(test, cst.UnaryOperation) else test
    assert isinstance(inner, cst.Call)
    return inner


def _environment_default(ctx: PyContext, node: cst.CSTNode) -> cst.Arg | None:
    """The default argument of ``os.environ.get("BACKEND", <default>)`` / ``os.getenv(...)``."""
    if isinstance(node, cst.Call) and ctx.qualname(node) in _ENV_READS and len(node.args) == 2:
        default = node.args[1]
        return default if default.keyword is None and not default.star else None
    return None


def is_nccl_backend(ctx: PyContext, node: cst.CSTNode) -> bool:
    """A backend expression TPU401 takes (see the module docstring)."""
    if _plain(ctx, node):
        return True
    if isinstance(node, cst.IfExp):
        return _plain(ctx, node.body) or _plain(ctx, node.orelse)
    default = _environment_default(ctx, node)
    return default is not None and _plain(ctx, default.value)


def _literal(ctx: PyContext, node: cst.BaseExpression) -> BackendRewrite:
    """The replacement of ``"nccl"``, ``Backend.NCCL`` or a combined string."""
    mixed = _mixed(node)
    if mixed is None:
        return BackendRewrite(ctx.default_backend(node if isinstance(node, cst.SimpleString) else None))
    if ctx.target.value == "tpu":
        return BackendRewrite(cst.SimpleString(f"{node.quote}{mixed.replace('cuda:nccl', 'tpu:tpu_dist')}{node.quote}"))  # type: ignore[attr-defined]
    return BackendRewrite(None, OMITTED_NOTE)


def _whole(ctx: PyContext, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The part of a backend expression that stands for all of it: the expression itself, or the NCCL branch of
    a conditional on an availability check with a gloo fallback ('the accelerator's backend, else gloo')."""
    if _plain(ctx, node):
        return node
    branches = check_branches(ctx, node)
    if branches is not None and _plain(ctx, branches[0]) and string_value(branches[1]) == "gloo":
        return branches[0]
    return None


def _part(ctx: PyContext, node: cst.BaseExpression) -> tuple[str, cst.BaseExpression] | None:
    """Where the NCCL value sits in an expression of which only that part changes: a user's flag choosing the
    NCCL branch (``"body"``/``"orelse"``), or the default of an environment read (``"default"``)."""
    if isinstance(node, cst.IfExp):
        return ("body", node.body) if _plain(ctx, node.body) else ("orelse", node.orelse)
    default = _environment_default(ctx, node)
    return ("default", default.value) if default is not None else None


def _rewritable(ctx: PyContext, original: cst.BaseExpression, omittable: bool) -> bool:
    """False where the default backend cannot stand in the expression: for the accelerator target, a combined
    string (the default there is two backends, which only an omitted argument gives) in a user's branch, an
    environment default, or where the whole value cannot be omitted."""
    if ctx.target.value == "tpu":
        return True
    whole = _whole(ctx, original)
    if whole is not None:
        return omittable or _mixed(whole) is None
    part = _part(ctx, original)
    return part is not None and _mixed(part[1]) is None


def _rewrite(ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression) -> BackendRewrite:
    whole = _whole(ctx, original)
    if whole is not None:
        return _literal(ctx, whole)
    part = _part(ctx, original)
    assert part is not None  # is_nccl_backend accepted it
    field, value = part
    new = _literal(ctx, value).value
    assert new is not None  # _rewritable
    if field != "default":
        return BackendRewrite(updated.with_changes(**{field: new}))
    args = [updated.args[0], updated.args[1].with_changes(value=new)]  # type: ignore[attr-defined]
    return BackendRewrite(updated.with_changes(args=args), " (the environment variable still overrides it)")


def fix_backend(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression | None = None, omittable: bool = True
) -> BackendRewrite | None:
    """Report TPU401 for the backend expression ``original`` (one :func:`is_nccl_backend` accepts) and return
    what it becomes when the fix applies (``updated``: its transformed form, whose other parts are kept), else
    None (the rule reports without fixing, or the expression cannot be rewritten: said in the finding).
    ``omittable``: the expression is an argument of the call that creates the group, which may go."""
    if not _rewritable(ctx, original, omittable):
        message = (
            f"backend {source(original)}: the accelerator's default is two backends (cpu:gloo plus its own), which "
            "only an omitted backend gives; choose it by hand, or rerun with --target tpu (not rewritten)"
        )
        ctx.report("TPU401", original, message, fixable=False)
        return None
    current = updated if updated is not None else original

    def shown(rewrite: BackendRewrite) -> str:
        return f"backend {source(original)} -> {source(rewrite.value) if rewrite.value is not None else 'the default'}"

    return ctx.fix("TPU401", original, lambda: _rewrite(ctx, original, current), lambda r: shown(r) + r.note)


def fix_backend_value(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression | None = None, entry: bool = False
) -> cst.BaseExpression | None:
    """:func:`fix_backend` where a value must stand (a variable, a default, a mapping ``entry`` of the call).
    Only an entry may become ``None`` (init_process_group's own default): a variable may be read elsewhere too,
    where ``None`` is no text and is falsy."""
    new = fix_backend(ctx, original, updated, omittable=entry)
    if new is None:
        return None
    return new.value if new.value is not None else cst.Name("None")
