"""Tests of a device: on a tensor (TPU104: ``x.is_cuda``, ``x.device.type == "cuda"``) and on a device string
(TPU101): ``device == "cuda"``, ``"cuda" in device``, ``device.startswith("cuda")``, ``device in ("cuda", "mps")``.

The device rules rewrite a CUDA device value where it is defined (``device = "cuda"`` becomes ``DEVICE.type``,
``"tpu"`` on TPU); a test of that value against ``"cuda"`` must change with it, or the migrated program takes
its CPU branch on TPU. build-nanogpt's ``device_type = "cuda" if device.startswith("cuda") else "cpu"`` gave
"cpu" there: autocast did nothing for TPU tensors, fused AdamW was off, the timer skipped its synchronize.
Comparing with ``DEVICE.type`` alone is not enough either: on a CPU-only machine it is "cpu", so
``device_type == DEVICE.type`` held where ``device_type == "cuda"`` did not (fused AdamW on the CPU). Every
test becomes :func:`on_accelerator`'s ``<type> == DEVICE.type != "cpu"``,
the form TPU104 writes for tensors: the accelerator branch on CUDA and on TPU, the CPU branch without an
accelerator. A substring or prefix test reads the type part of the string (``device.partition(":")[0]``,
"cuda" for "cuda:1"). A membership test in a collection that holds "cuda" asks the same, or for the collection's
other members (``device == DEVICE.type != "cpu" or device == "mps"``); one without "cuda" is left alone.

The values tested: a name or attribute whose name says device (the definition rules rewrite those by name),
or whose every use is a device position (the value-flow analysis; a prefix test counts as a comparison
there), and ``str()`` of one. ``x.device.type == "cuda"`` is TPU104's.
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.analysis.valueflow import Verdict, attr_key
from tpu_agent.migrate.rules import devices
from tpu_agent.migrate.rules._bound import key_of
from tpu_agent.migrate.rules._cst import (
    keep_parens,
    keyword,
    positional,
    replace_original_arg,
    source,
    string_value,
    updated_index,
)
from tpu_agent.migrate.rules.devices import DEVICE_VAR_RE, is_device_variable, rewrite_device

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

_EQUALITY = (cst.Equal, cst.NotEqual)
_MEMBERSHIP = (cst.In, cst.NotIn)
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)


_COLLECTIONS = (cst.Tuple, cst.List, cst.Set)


def holds_cuda(node: cst.CSTNode) -> bool:
    """``"cuda"``, or a tuple, list or set literal with a ``"cuda"`` element (``device in ("cuda", "mps")``)."""
    if isinstance(node, _COLLECTIONS):
        return any(isinstance(e, cst.Element) and string_value(e.value) == "cuda" for e in node.elements)
    return string_value(node) == "cuda"


def on_accelerator(
    ctx: PyContext, device_type: cst.BaseExpression, negated: bool = False, among: cst.BaseExpression | None = None
) -> cst.BaseExpression:
    """``<device_type> == DEVICE.type != "cpu"`` (for the tpu target ``<device_type> == "tpu"``): the device
    is the accelerator in use; exactly 'on CUDA' on a CUDA machine and False on a CPU-only one. ``negated``
    wraps it in ``not (...)``.

    ``among`` is the collection of a membership test holding "cuda" (``device in ("cuda", "mps")``): "cuda"
    there means the accelerator too, so its other members are asked after it (``... != "cpu" or device ==
    "mps"``). Swapping "cuda" for ``DEVICE.type`` inside the collection would hold for "cpu" on a CPU-only
    machine, which the original test never did."""
    collection = among if isinstance(among, _COLLECTIONS) else None
    others = [e for e in collection.elements if not holds_cuda(e.value)] if collection is not None else []
    if ctx.target.value == "tpu":
        operator = cst.NotEqual() if negated and not others else cst.Equal()
        check: cst.BaseExpression = cst.Comparison(
            left=device_type, comparisons=[cst.ComparisonTarget(operator, ctx.device_type())]
        )
    else:
        targets = [
            cst.ComparisonTarget(operator=cst.Equal(), comparator=ctx.device_type()),
            cst.ComparisonTarget(operator=cst.NotEqual(), comparator=ctx.string("cpu")),
        ]
        check = cst.Comparison(left=device_type, comparisons=targets)
    if collection is not None and others:
        member = _member(device_type.deep_clone(), collection, others)
        check = cst.BooleanOperation(left=check, operator=cst.Or(), right=member)
    if negated and (others or ctx.target.value != "tpu"):
        check = cst.UnaryOperation(
            operator=cst.Not(), expression=check.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        )
    return check


def cuda_comparison(target: cst.ComparisonTarget) -> bool:
    """``== "cuda"`` / ``!= "cuda"``, or ``in`` / ``not in`` a collection literal holding "cuda"."""
    if isinstance(target.operator, (cst.Equal, cst.NotEqual)):
        return string_value(target.comparator) == "cuda"
    return (
        isinstance(target.operator, (cst.In, cst.NotIn))
        and isinstance(target.comparator, _COLLECTIONS)
        and holds_cuda(target.comparator)
    )


def needs_room(ctx: PyContext, original: cst.BaseExpression, test: cst.BaseExpression) -> bool:
    """Whether the test :func:`on_accelerator` built in place of the comparison ``original`` needs parentheses:
    ``not (...)`` where no comparison could stand bare, ``... or ...`` there or as an operand of ``and``/``not``."""
    if isinstance(test, cst.BooleanOperation):
        return not ctx.is_bare(original) or ctx.is_operand(original)
    return isinstance(test, cst.UnaryOperation) and not ctx.is_bare(original)


def _member(
    subject: cst.BaseExpression, collection: cst.Tuple | cst.List | cst.Set, others: list[cst.BaseElement]
) -> cst.Comparison:
    """``subject == "mps"`` for one other member, ``subject in ("mps", "xpu")`` (the collection without its
    "cuda") for more."""
    if len(others) == 1 and isinstance(others[0], cst.Element):
        return cst.Comparison(left=subject, comparisons=[cst.ComparisonTarget(cst.Equal(), others[0].value)])
    kept = [*others[:-1], others[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
    if isinstance(collection, cst.Tuple) and len(kept) == 1:  # a starred element alone: (*extra,)
        kept = [kept[0].with_changes(comma=cst.Comma())]
    rest = collection.with_changes(elements=kept)
    return cst.Comparison(left=subject, comparisons=[cst.ComparisonTarget(cst.In(), rest)])


@devices.FAMILY.leave(cst.Attribute)
def is_cuda_attribute(ctx: PyContext, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
    if original.attr.value != "is_cuda" or ctx.is_call_func(original) or ctx.qualname(original) is not None:
        return updated
    if _own_is_cuda(ctx, original):
        return updated

    def build() -> cst.BaseExpression:
        device = cst.Attribute(value=updated.value, attr=cst.Name("device"))
        return on_accelerator(ctx, cst.Attribute(value=device, attr=cst.Name("type")))

    new = ctx.fix("TPU104", original, build, lambda n: f"{source(original)} -> {source(n)}")
    if new is None:
        return updated
    if not ctx.is_bare(original):
        new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return keep_parens(original, new)


def _own_is_cuda(ctx: PyContext, node: cst.Attribute) -> bool:
    """Whether ``node`` is a class's own ``is_cuda`` flag, not ``Tensor.is_cuda`` (read-only, so never assigned):
    assigned here, or read on ``self`` in a module that assigns it (timm's loaders set ``self.is_cuda =
    device.type == 'cuda' and torch.cuda.is_available()``, whose value the other rules port, and read it back)."""
    if ctx.is_target(node):
        return True
    receiver = node.value
    return (
        isinstance(receiver, cst.Name)
        and receiver.value in ("self", "cls")
        and bool(ctx.bindings.of(attr_key("is_cuda")))
    )


@devices.FAMILY.leave(cst.Comparison)
def device_type_comparison(ctx: PyContext, original: cst.Comparison, updated: cst.Comparison) -> cst.BaseExpression:
    # x.device.type == "cuda"  ->  x.device.type == DEVICE.type != "cpu"; also `in ("cuda", "mps")`
    if not (isinstance(original.left, cst.Attribute) and original.left.attr.value == "type"):
        return updated
    cuda = [c for c in original.comparisons if cuda_comparison(c)]
    if not cuda:
        return updated
    if len(original.comparisons) != 1:
        ctx.report(
            "TPU104",
            original,
            f"{source(original)}: compare x.device.type with DEVICE.type (a chain of comparisons is left as it is)",
            fixable=False,
        )
        return updated
    negated = isinstance(cuda[0].operator, (cst.NotEqual, cst.NotIn))
    among = updated.comparisons[0].comparator
    new = ctx.fix(
        "TPU104",
        original,
        lambda: on_accelerator(ctx, updated.left, negated, among),
        lambda n: f"{source(original)} -> {source(n)}",
    )
    if new is None:
        return updated
    if needs_room(ctx, original, new):
        new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return keep_parens(original, new)


def _is_device_string(ctx: PyContext, node: cst.BaseExpression) -> bool:
    """``device``, ``args.device``, a name only ever used as a device, or ``str()`` of one (not ``x.type``)."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "str"
        and "str" not in ctx.aliases
        and len(node.args) == 1
        and node.args[0].keyword is None
        and not node.args[0].star
    ):
        node = node.args[0].value
    if isinstance(node, cst.Attribute) and node.attr.value == "type":
        return False
    if is_device_variable(node):
        return True
    if isinstance(node, cst.Subscript) and isinstance(node.value, (cst.Name, cst.Attribute)):
        # devices[0] == "cuda" (detectron2's export): an element of a list named for devices
        name = node.value.value if isinstance(node.value, cst.Name) else node.value.attr.value
        return name.lower().endswith("devices")
    key = key_of(node)
    return key is not None and ctx.value_flow.flow(key[0]).verdict is Verdict.DEVICE


def _type_part(ctx: PyContext, value: cst.BaseExpression) -> cst.BaseExpression:
    """``value.partition(":")[0]``: the device type a device string names."""
    if not isinstance(value, _ATOMS) and not value.lpar:
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    partition = cst.Call(func=cst.Attribute(value=value, attr=cst.Name("partition")), args=[cst.Arg(ctx.string(":"))])
    return cst.Subscript(value=partition, slice=[cst.SubscriptElement(cst.Index(cst.Integer("0")))])


def _rewrite(
    ctx: PyContext,
    original: cst.BaseExpression,
    subject: cst.BaseExpression,
    negated: bool,
    among: cst.BaseExpression | None = None,
    code: str = "TPU101",
) -> cst.BaseExpression | None:
    """Report and build ``on_accelerator(subject)`` for the test ``original`` (``among``: the collection of a
    membership test); None when not fixed. ``code``: TPU104 for a tensor's device type."""
    what = "a device string" if code == "TPU101" else "a device type"
    new = ctx.fix(
        code,
        original,
        lambda: on_accelerator(ctx, subject, negated, among),
        lambda n: f"{source(original)} -> {source(n)} (a test on {what}: the accelerator in use, not the CPU)",
    )
    if new is None:
        return None
    # a comparison stands wherever the compared one stood; `not (...)` and a comparison replacing a call need room
    if (isinstance(original, cst.Call) and not ctx.is_bare(original)) or needs_room(ctx, original, new):
        new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return keep_parens(original, new)


def _report_indexed_test(ctx: PyContext, original: cst.Comparison) -> None:
    """``device == "cuda:0"`` tests for one CUDA device by its index: TorchTPU gives every process one device
    (each rank's is tpu:0), and the device rules write the type without the index, so the test would silently
    never hold. Which device the index stood for is the author's; reported with the type comparison to use."""
    if len(original.comparisons) != 1 or not isinstance(original.comparisons[0].operator, _EQUALITY):
        return
    pair = (original.left, original.comparisons[0].comparator)
    for literal, other in (pair, pair[::-1]):
        text = string_value(literal) or ""
        if text.startswith("cuda:") and devices.cuda_device_code(ctx, literal) and _is_device_string(ctx, other):
            ctx.report(
                "TPU101",
                original,
                f"{source(original)}: a test for one CUDA device by its index; TorchTPU runs one device per process: "
                f'compare the device type ({source(_type_part(ctx, other))} == DEVICE.type != "cpu") if that is meant',
                fixable=False,
            )
            return


@devices.FAMILY.leave(cst.Comparison)
def device_string_comparison(ctx: PyContext, original: cst.Comparison, updated: cst.Comparison) -> cst.BaseExpression:
    # device == "cuda", "cuda" == device, device != "cuda", "cuda" in device, "cuda" not in device,
    # device in ("cuda", "mps"), device not in {"cuda"}
    if not ctx.mentions("cuda"):
        return updated
    sides = [original.left, *(c.comparator for c in original.comparisons)]
    if not any(holds_cuda(side) for side in sides):
        _report_indexed_test(ctx, original)
        return updated
    if len(original.comparisons) != 1:
        if any(_is_device_string(ctx, s) for s in sides):
            ctx.report(
                "TPU101",
                original,
                f'{source(original)}: compare the device with DEVICE.type != "cpu" (a chain of comparisons is '
                "left as it is)",
                fixable=False,
            )
        return updated
    operator = original.comparisons[0].operator
    left, right = original.left, original.comparisons[0].comparator
    after = (updated.left, updated.comparisons[0].comparator)
    subject: cst.BaseExpression | None = None
    if cuda_comparison(original.comparisons[0]) and _is_device_string(ctx, left):
        subject = after[0]  # device == "cuda", device in ("cuda", "mps"): "cuda" means the accelerator
    elif isinstance(operator, _EQUALITY) and string_value(left) == "cuda" and _is_device_string(ctx, right):
        subject = after[1]
    elif isinstance(operator, _MEMBERSHIP) and string_value(left) == "cuda" and _is_device_string(ctx, right):
        subject = _type_part(ctx, after[1])
    elif string_value(left) == "cuda" and isinstance(right, cst.Attribute) and right.attr.value == "type":
        # "cuda" in device.type, "cuda" == x.device.type (yolov5's benchmarks): TPU104's test, written the other way
        negated = isinstance(operator, (cst.NotEqual, cst.NotIn))
        new = _rewrite(ctx, original, after[1], negated, code="TPU104")
        return new if new is not None else updated
    if subject is None:
        return updated
    negated = isinstance(operator, (cst.NotEqual, cst.NotIn))
    new = _rewrite(ctx, original, subject, negated, after[1])
    return new if new is not None else updated


@devices.FAMILY.leave(cst.Call)
def device_string_prefix(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    # device.startswith("cuda") -> device.partition(":")[0] == DEVICE.type != "cpu"
    func = original.func
    if not (
        isinstance(func, cst.Attribute)
        and func.attr.value == "startswith"
        and len(original.args) == 1
        and original.args[0].keyword is None
        and string_value(original.args[0].value) == "cuda"
        and isinstance(updated.func, cst.Attribute)
        and _is_device_string(ctx, func.value)
    ):
        return updated
    new = _rewrite(ctx, original, _type_part(ctx, updated.func.value), negated=False)
    return new if new is not None else updated


@devices.FAMILY.leave(cst.Call)
def device_parametrization(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    """``@pytest.mark.parametrize("device", ["cpu", "cuda"])`` and ``("device,dtype", [("cuda", ...), ...])``: the
    parameter's name says device, so its "cuda" cases are the accelerator's (``DEVICE.type``, ``"tpu"``) as in a
    ``device = "cuda"`` definition; the test's own comparisons with "cuda" follow (the rules above)."""
    if type(updated) is not cst.Call or ctx.qualname(original) != "pytest.mark.parametrize":
        return updated
    names = positional(original, 0) or keyword(original, "argnames")
    cases = positional(original, 1) or keyword(original, "argvalues")
    if names is None or cases is None or not isinstance(cases.value, (cst.List, cst.Tuple)):
        return updated
    text = string_value(names.value)
    if text is not None:
        argnames = [name.strip() for name in text.split(",")]
    elif isinstance(names.value, (cst.List, cst.Tuple)):
        argnames = [string_value(e.value) or "" for e in names.value.elements]
    else:
        return updated
    at = next(
        (i for i, name in enumerate(argnames) if name.isidentifier() and is_device_variable(cst.Name(name))), None
    )
    if at is None:
        return updated
    current = updated.args[updated_index(original, updated, cases)].value
    if not isinstance(current, (cst.List, cst.Tuple)) or len(current.elements) != len(cases.value.elements):
        return updated
    elements = list(current.elements)
    changed = False
    for i, case in enumerate(cases.value.elements):
        new = _case_device(ctx, case.value, elements[i].value, at if len(argnames) > 1 else None)
        if new is not None:
            elements[i] = elements[i].with_changes(value=new)
            changed = True
    if not changed:
        return updated
    return replace_original_arg(original, updated, cases, current.with_changes(elements=elements))


def _case_device(
    ctx: PyContext, case: cst.BaseExpression, current: cst.BaseExpression, at: int | None
) -> cst.BaseExpression | None:
    """One parametrize case with its CUDA device (the whole case, or its ``at``-th value) as the accelerator's."""
    if at is None:
        return devices.rewrite_device(ctx, case, "type", updated=current)
    if not isinstance(case, (cst.Tuple, cst.List)) or not isinstance(current, (cst.Tuple, cst.List)):
        return None
    if len(case.elements) <= at or len(current.elements) != len(case.elements):
        return None
    value = devices.rewrite_device(ctx, case.elements[at].value, "type", updated=current.elements[at].value)
    if value is None:
        return None
    items = list(current.elements)
    items[at] = items[at].with_changes(value=value)
    return current.with_changes(elements=items)


_PATCHERS = frozenset({"unittest.mock.patch", "unittest.mock.patch.object", "mock.patch", "mock.patch.object"})


@devices.FAMILY.leave(cst.Call)
def patched_device(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    """A test that patches a device-named attribute with a CUDA device: ``monkeypatch.setattr("pkg.utils.device_type",
    "cuda")``, ``monkeypatch.setattr(utils, "device_type", "cuda")``, ``mock.patch("pkg.device_type", "cuda")``,
    ``patch.object(utils, "device", "cuda")``. The value stands where the module's own device value stood, so it is
    rewritten as that one is (torchtitan's tests patch its ``device_type`` so)."""
    func = original.func
    monkeypatch = (
        isinstance(func, cst.Attribute)
        and func.attr.value == "setattr"
        and isinstance(func.value, cst.Name)
        and func.value.value == "monkeypatch"
    )
    if not monkeypatch and ctx.qualname(original) not in _PATCHERS:
        return updated
    args = [arg for arg in original.args if arg.keyword is None and not arg.star]
    for name, value in pairwise(args):
        text = string_value(name.value)
        if text is not None and DEVICE_VAR_RE.search(text.rpartition(".")[2]):
            new = rewrite_device(
                ctx, value.value, "type", updated=updated.args[updated_index(original, updated, value)].value
            )
            return replace_original_arg(original, updated, value, new) if new is not None else updated
    return updated
