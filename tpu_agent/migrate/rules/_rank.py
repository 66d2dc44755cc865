"""The device of a rank: what a device built from an index (``f"cuda:{local_rank}"``, ``torch.device("cuda",
local_rank)``, ``.to(local_rank)``) becomes.

TorchTPU binds one device per process, which each rank sees as ``tpu:0``: ``tpu:1`` on rank 1 names a device
the process cannot use, and ``set_device`` with another index raises. So on TPU the index goes and the device
is the process's own (``DEVICE``). On CUDA and the other accelerators the index still picks the rank's device:
dropping it there put every rank of a program that never calls ``set_device`` on device 0. The accelerator
target writes both, chosen at run time (``DEVICE if DEVICE.type in ("cpu", "tpu") else torch.device(DEVICE.type,
local_rank)``; the CPU has one device too, so CPU-only runs keep the plain device as before); the tpu target
writes the plain device only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import Target
from tpu_agent.migrate.rules._bound import key_of
from tpu_agent.migrate.rules._cst import keep_parens, string_value

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

# device types with one device per process: the plain device is the process's own there
_ONE_DEVICE_TYPES = ("cpu", "tpu")


# names that hold a rank or a GPU index in training scripts (``local_rank``, ``args.gpu``, ``gpu_id``)
_RANK_NAME_RE = re.compile(r"(?:local_?rank|rank|gpu|gpu_?id|gpu_?idx|local_?gpu|cuda_?id)", re.IGNORECASE)

# functions returning the process's rank (``dist.get_rank()``, ``accelerator.get_local_rank()``)
_RANK_FUNCTIONS = frozenset({"get_rank", "get_local_rank"})


def is_rank_value(node: cst.CSTNode) -> bool:
    """``local_rank``, ``args.gpu``, ``self.rank``, ``int(os.environ["LOCAL_RANK"])`` or one of them modulo the
    node's device count (DiT's ``rank % torch.cuda.device_count()``), ``dist.get_rank()``: an integer device
    index."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        return is_rank_value(node.left)
    if isinstance(node, cst.Call) and not node.args:
        function = node.func.attr if isinstance(node.func, cst.Attribute) else node.func
        return isinstance(function, cst.Name) and function.value in _RANK_FUNCTIONS
    if isinstance(node, cst.Name):
        return bool(_RANK_NAME_RE.fullmatch(node.value))
    if isinstance(node, cst.Attribute):
        return bool(_RANK_NAME_RE.fullmatch(node.attr.value))
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "int"):
        return False
    inner = node.args[0].value if len(node.args) == 1 else None
    if isinstance(inner, cst.Subscript) and len(inner.slice) == 1:
        key = inner.slice[0].slice
        return isinstance(key, cst.Index) and string_value(key.value) in ("LOCAL_RANK", "RANK")
    if isinstance(inner, cst.Call) and inner.args:
        return string_value(inner.args[0].value) in ("LOCAL_RANK", "RANK")
    return False


def always_bound_to_rank(ctx: PyContext, node: cst.BaseExpression) -> bool:
    """Whether a name or attribute that is no rank by its name holds one wherever it is read: every binding of
    it in the module is a rank value (DiT's ``device = rank % torch.cuda.device_count()``, then
    ``model.to(device)`` and ``device=device`` all through the training loop)."""
    key = key_of(node)
    if key is None:
        return False
    values = ctx.bindings.of(key[0])
    return bool(values) and all(
        value is not None and is_rank_value(cst.parse_expression(ast.unparse(value))) for value in values
    )


def is_rank_index(index: cst.BaseExpression | None) -> bool:
    """An index computed at run time (a rank, ``args.gpu``), not a literal such as the 3 of "cuda:3"."""
    return index is not None and not isinstance(index, cst.Integer)


def rank_device(
    ctx: PyContext, plain: cst.BaseExpression, indexed: Callable[[], cst.BaseExpression | None]
) -> cst.BaseExpression:
    """``plain if DEVICE.type in ("cpu", "tpu") else indexed()`` for the accelerator target, ``plain`` for the
    tpu target (and where ``indexed`` builds nothing): the process's one device on TPU, the rank's indexed
    device elsewhere."""
    if ctx.target is Target.TPU:
        return plain
    other = indexed()
    if other is None:
        return plain
    one_device = cst.Tuple([cst.Element(ctx.string(kind)) for kind in _ONE_DEVICE_TYPES])
    test = cst.Comparison(left=ctx.device_type(), comparisons=[cst.ComparisonTarget(cst.In(), one_device)])
    return cst.IfExp(test=test, body=plain, orelse=other)


def is_rank_choice(ctx: PyContext, node: cst.IfExp) -> bool:
    """Whether ``node`` is a choice :func:`rank_device` wrote (its indexed branch is not to be rewritten again)."""
    test = node.test
    return (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.In)
        and isinstance(test.left, cst.Attribute)
        and test.left.attr.value == "type"
        and isinstance(test.left.value, cst.Name)
        and test.left.value.value == ctx.device_name
        and isinstance(test.comparisons[0].comparator, cst.Tuple)
        and tuple(string_value(e.value) for e in test.comparisons[0].comparator.elements) == _ONE_DEVICE_TYPES
    )


def in_place(ctx: PyContext, original: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    """``new`` standing where ``original`` stood: a choice between devices needs parentheses where an operand or
    a receiver stood (``(DEVICE if ... else ...).type``), and keeps those ``original`` had."""
    if isinstance(new, cst.IfExp) and not ctx.is_bare(original):
        new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return keep_parens(original, new)


def indexed_device(ctx: PyContext, index: cst.BaseExpression) -> cst.Call:
    """``torch.device(DEVICE.type, index)``: the accelerator in use, at the rank's index."""
    return cst.Call(func=ctx.torch_attr("device"), args=[cst.Arg(ctx.device_type()), cst.Arg(index)])


def indexed_type(ctx: PyContext, template: cst.BaseExpression) -> cst.BaseExpression | None:
    """A device string built from an index with the accelerator's type in place of "cuda", or None when
    ``template`` is no such string: ``f"{DEVICE.type}:{rank}"`` for ``f"cuda:{rank}"``, ``DEVICE.type +
    ":%d" % rank`` for ``"cuda:%d" % rank`` (``+`` binds more loosely than ``%``), ``DEVICE.type + ":" +
    str(rank)``, ``DEVICE.type + ":{}".format(rank)``. The index expression keeps the quotes it was written in."""
    if isinstance(template, cst.FormattedString):
        first = template.parts[0]
        if not (isinstance(first, cst.FormattedStringText) and first.value.startswith("cuda")):
            return None
        kind = cst.FormattedStringExpression(expression=ctx.device_type())
        text = cst.FormattedStringText(first.value.removeprefix("cuda"))
        return template.with_changes(parts=[kind, text, *template.parts[1:]])
    if isinstance(template, cst.BinaryOperation):
        left = _without_cuda(template.left)
        return _after_type(ctx, template.with_changes(left=left)) if left is not None else None
    if isinstance(template, cst.Call) and isinstance(template.func, cst.Attribute):
        receiver = _without_cuda(template.func.value)
        if receiver is None:
            return None
        return _after_type(ctx, template.with_changes(func=template.func.with_changes(value=receiver)))
    return None


def _without_cuda(node: cst.BaseExpression) -> cst.SimpleString | None:
    """``":%d"`` for the literal ``"cuda:%d"``: the string without its leading "cuda", in its own quotes."""
    value = string_value(node)
    if value is None or not value.startswith("cuda") or not isinstance(node, cst.SimpleString):
        return None
    return node.with_changes(value=node.value.replace("cuda", "", 1))


def _after_type(ctx: PyContext, rest: cst.BaseExpression) -> cst.BinaryOperation:
    return cst.BinaryOperation(left=ctx.device_type(), operator=cst.Add(), right=rest)
