"""Complex rotary embeddings: the product rewritten in real arithmetic where it is local (TPU823), every other
complex use reported (TPU820).

Complex rotary embeddings crash in TorchTPU's backward (TorchTitan's TPU experiments and bug notes against
torch_tpu 0.1-0.2). The usual code (Meta's Llama, TorchTitan, gpt-fast) views the query's pairs as complex
numbers, multiplies them by the complex frequencies and views the product as real again::

    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)

The product is ``(a + bi)(c + di) = (ac - bd) + (ad + bc)i``, so when the complex view is made in the same
function from a real tensor of pairs, the rewrite keeps that tensor under its own name and computes the product
from it and the factor's ``.real``/``.imag``: the same values, and the gradient reaches the pairs through real
ops only. The complex view stays for whatever else reads it (``reshape_for_broadcast(freqs_cis, xq_)`` reads
its shape). Only a factor that is a plain name or attribute is rewritten (it is read four times), and only a
view assigned once in the function, so every read of the name is the view the product used.

Where the complex values cross functions in another way (``torch.polar`` building the frequencies, a complex
view returned or passed on), the real rotation is the person's to write: TPU820 reports the line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.analysis.local_names import target_names
from tpu_agent.migrate.cstnodes import TreeReader
from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules import third_party
from tpu_agent.migrate.rules._cst import source
from tpu_agent.migrate.rules.references import TORCH_TPU

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

VIEW_AS_COMPLEX = "https://docs.pytorch.org/docs/stable/generated/torch.view_as_complex.html"

_COMPLEX_ROTARY = (
    "complex rotary embeddings crash in TorchTPU's backward: rotate in real arithmetic instead, with "
    "cos/sin tables (cos = freqs.cos(), sin = freqs.sin()) and the pairs x1, x2 = x[..., ::2], x[..., 1::2]: "
    "out = stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)"
)

third_party.FAMILY.rule(
    code="TPU820",
    name="complex-rotary-embedding",
    safety=Safety.MANUAL,
    summary="torch.view_as_complex / torch.polar: complex rotary position embeddings.",
    rationale="Reported in TorchTitan's TPU experiments and bug notes against torch_tpu: " + _COMPLEX_ROTARY + ". "
    "TPU823 rewrites the common local form (a complex view multiplied and viewed as real in one function); this "
    "rule reports the complex uses left.",
    before="freqs_cis = torch.polar(torch.ones_like(freqs), freqs)\n"
    "xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))\n"
    "xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)",
    after="cos, sin = freqs.cos(), freqs.sin()\nx1, x2 = xq.float()[..., ::2], xq.float()[..., 1::2]\n"
    "xq_out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(3)",
    references=(VIEW_AS_COMPLEX, TORCH_TPU),
    apis=(ApiEquivalent("torch.view_as_complex, torch.polar (rotary embeddings)", "real sin/cos rotation"),),
)
third_party.FAMILY.rule(
    code="TPU823",
    name="complex-rotary-product",
    safety=Safety.SAFE,
    summary="torch.view_as_real(torch.view_as_complex(pairs) * freqs): a rotary product computed in complex numbers.",
    rationale="Complex rotary embeddings crash in TorchTPU's backward (TorchTitan's TPU experiments, bug notes "
    "against torch_tpu). The product of the pairs viewed as complex and the complex frequencies is "
    "(a + bi)(c + di) = (ac - bd) + (ad + bc)i: computed from the real pairs and the frequencies' .real and "
    ".imag it has the same values, and the gradient reaches the pairs through real ops only. The complex view "
    "stays for whatever else reads it.",
    before="xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))\n"
    "xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)",
    after="xq_pairs = xq.float().reshape(*xq.shape[:-1], -1, 2)\nxq_ = torch.view_as_complex(xq_pairs)\n"
    "xq_out = torch.stack((xq_pairs[..., 0] * freqs_cis.real - xq_pairs[..., 1] * freqs_cis.imag, "
    "xq_pairs[..., 0] * freqs_cis.imag + xq_pairs[..., 1] * freqs_cis.real), dim=-1).flatten(3)",
    references=(VIEW_AS_COMPLEX, TORCH_TPU),
    apis=(
        ApiEquivalent(
            "torch.view_as_real(torch.view_as_complex(pairs) * freqs)",
            "the product from pairs[..., 0], pairs[..., 1], freqs.real and freqs.imag",
        ),
    ),
)


@dataclass(frozen=True)
class _ComplexView:
    """``name = torch.view_as_complex(pairs)``, a statement of the function's own body, and its products."""

    name: str
    pairs_name: str
    statement: cst.SimpleStatementLine
    call: cst.Call
    products: tuple[cst.Call, ...]


def _view_source(ctx: PyContext, statement: cst.SimpleStatementLine) -> tuple[str, cst.Call] | None:
    """(name, call) for a statement ``name = torch.view_as_complex(pairs)`` with one positional argument."""
    if len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    target, call = assign.targets[0].target, assign.value
    if not (isinstance(target, cst.Name) and isinstance(call, cst.Call)) or len(call.args) != 1:
        return None
    arg = call.args[0]
    if arg.keyword is not None or arg.star or ctx.qualname(call.func) != "torch.view_as_complex":
        return None
    return target.value, call


def _product_operands(call: cst.Call, names: Sequence[str]) -> tuple[str, cst.BaseExpression] | None:
    """(view name, factor) when ``call``'s one argument is ``view * factor`` or ``factor * view`` with a factor
    that is a name or an attribute (it is read four times: a call there could change what it returns)."""
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        return None
    product = call.args[0].value
    if not isinstance(product, cst.BinaryOperation) or not isinstance(product.operator, cst.Multiply):
        return None
    for view, factor in ((product.left, product.right), (product.right, product.left)):
        if isinstance(view, cst.Name) and view.value in names and isinstance(factor, cst.Name | cst.Attribute):
            if not (isinstance(factor, cst.Name) and factor.value in names):
                return view.value, factor
    return None


class _OwnBody:
    """Walks one function's own body: nested functions, classes and lambdas are handled on their own visit."""

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


class _FunctionScan(_OwnBody, TreeReader):
    """In one function body (nested functions and classes are scanned on their own): how often each name is
    bound, every name read, and the ``torch.view_as_real`` calls."""

    def __init__(self, ctx: PyContext) -> None:
        self.ctx = ctx
        self.bindings: dict[str, int] = {}
        self.names: set[str] = set()
        self.real_views: list[cst.Call] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def _bind(self, target: cst.CSTNode) -> None:
        for name in target_names(target):
            self.bindings[name] = self.bindings.get(name, 0) + 1

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) == "torch.view_as_real":
            self.real_views.append(node)


def _complex_views(ctx: PyContext, function: cst.FunctionDef) -> list[_ComplexView]:
    """The rewritable complex views of ``function``: assigned once, in its own body, from one real tensor of
    pairs, and multiplied at least once in a ``torch.view_as_real`` by a name or an attribute."""
    if not isinstance(function.body, cst.IndentedBlock):
        return []
    scan = _FunctionScan(ctx)
    function.body.visit(scan)
    params = {param.name.value for param in (*function.params.params, *function.params.kwonly_params)}
    candidates: dict[str, tuple[cst.SimpleStatementLine, cst.Call]] = {}
    for statement in function.body.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        found = _view_source(ctx, statement)
        if found is not None and scan.bindings.get(found[0]) == 1 and found[0] not in params:
            candidates[found[0]] = (statement, found[1])
    products: dict[str, list[cst.Call]] = {}
    for call in scan.real_views:
        operands = _product_operands(call, list(candidates))
        if operands is not None:
            products.setdefault(operands[0], []).append(call)
    views = []
    for name, calls in products.items():
        pairs_name = f"{name.rstrip('_') or 'x'}_pairs"
        if pairs_name in scan.names or pairs_name in params:
            continue  # the name is taken in this function: leave the view to TPU820
        statement, call = candidates[name]
        views.append(_ComplexView(name, pairs_name, statement, call, tuple(calls)))
    return views


def _real_product(ctx: PyContext, pairs_name: str, factor: cst.BaseExpression) -> cst.BaseExpression:
    """``(a + bi)(c + di) = (ac - bd) + (ad + bc)i`` from the pairs ``[..., 0]``/``[..., 1]`` (a, b) and the
    factor's ``.real``/``.imag`` (c, d), stacked as ``torch.view_as_real`` lays them out."""
    stack = source(ctx.torch_attr("stack"))
    a, b = f"{pairs_name}[..., 0]", f"{pairs_name}[..., 1]"
    c, d = f"{source(factor)}.real", f"{source(factor)}.imag"
    return cst.parse_expression(f"{stack}(({a} * {c} - {b} * {d}, {a} * {d} + {b} * {c}), dim=-1)")


class _RewriteProducts(_OwnBody, cst.CSTTransformer):
    """The products of the planned views in an (updated) function body, and the views' statements split."""

    def __init__(self, ctx: PyContext, views: Sequence[_ComplexView]) -> None:
        self.ctx = ctx
        self.views = {view.name: view.pairs_name for view in views}
        # matched by their text: the qualified-name cache is keyed by node ids, which new nodes may reuse
        self.functions = {source(product.func) for view in views for product in view.products}
        self.products = 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if source(updated.func) not in self.functions:
            return updated
        operands = _product_operands(updated, list(self.views))
        if operands is None:
            return updated
        self.products += 1
        return _real_product(self.ctx, self.views[operands[0]], operands[1])


def _split_view(statement: cst.BaseStatement, view: _ComplexView) -> list[cst.BaseStatement] | None:
    """``pairs = <its argument>`` then ``name = torch.view_as_complex(pairs)``, or None when the statement is no
    longer the view's (another rule rewrote it)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or not isinstance(assign.value, cst.Call) or len(assign.value.args) != 1:
        return None
    target = assign.targets[0].target
    if not isinstance(target, cst.Name) or target.value != view.name:
        return None
    pairs = assign.value.args[0].value
    keep = cst.SimpleStatementLine(
        body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(view.pairs_name))], value=pairs)],
        leading_lines=statement.leading_lines,
    )
    complex_view = assign.with_changes(value=assign.value.with_changes(args=[cst.Arg(cst.Name(view.pairs_name))]))
    return [keep, statement.with_changes(body=[complex_view], leading_lines=[])]


def _may_rewrite(ctx: PyContext) -> bool:
    """Whether functions of this file are worth scanning: the rule is on and the file names the complex view (the
    scan walks each function's body, which every other file is spared)."""
    return ctx.mentions("view_as_complex") and ctx.options.rule_enabled("TPU823")


@third_party.FAMILY.visit(cst.FunctionDef)
def _plan_real_products(ctx: PyContext, node: cst.FunctionDef) -> None:
    """Claim the planned views' ``torch.view_as_complex`` so TPU820 does not report what TPU823 rewrites."""
    if not _may_rewrite(ctx):
        return
    for view in _complex_views(ctx, node):
        ctx.claim(view.call.func)


@third_party.FAMILY.leave(cst.FunctionDef)
def real_products(ctx: PyContext, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
    if not _may_rewrite(ctx):
        return updated
    views = [view for view in _complex_views(ctx, original) if ctx.is_claimed(view.call.func)]
    if not views or not isinstance(updated.body, cst.IndentedBlock):
        return updated
    by_statement = {id(view.statement): view for view in views}
    body: list[cst.BaseStatement] = []
    split = 0
    for before, after in zip(original.body.body, updated.body.body, strict=False):
        view = by_statement.get(id(before))
        lines = _split_view(after, view) if view is not None else None
        split += lines is not None
        body.extend(lines if lines is not None else [after])
    rewriter = _RewriteProducts(ctx, views)
    rewritten = cst.IndentedBlock(body=body).visit(rewriter)
    planned = sum(len(view.products) for view in views)
    if len(original.body.body) != len(updated.body.body) or split != len(views) or rewriter.products != planned:
        for view in views:  # another rule changed these lines: report what is left as TPU820 would
            ctx.report("TPU820", view.call, f"torch.view_as_complex: {_COMPLEX_ROTARY}")
        return updated
    fixed = False
    for view in views:
        for product in view.products:
            fixed |= ctx.report(
                "TPU823",
                product,
                f"computed {source(product.args[0].value)} from the real pairs {view.pairs_name} and the factor's "
                f".real/.imag: {_COMPLEX_ROTARY.split(':')[0]}; the values are the same",
            )
    if not fixed or not isinstance(rewritten, cst.IndentedBlock):
        return updated
    return updated.with_changes(body=updated.body.with_changes(body=rewritten.body))


@third_party.FAMILY.reference("torch.view_as_complex", "torch.polar")
def complex_rotary_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    ctx.report("TPU820", original, f"{qualname}: {_COMPLEX_ROTARY}")
    return updated
