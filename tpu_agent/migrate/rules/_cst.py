"""Small libcst builders and argument helpers shared by the rule families.

Rewrites replace as little as possible: an argument's value rather than the argument, an argument rather than
the call. Everything else (comments inside calls, line breaks, trailing commas) stays as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

_ASCII_STR_PREFIXES = frozenset({"", "r", "u", "R", "U"})


def string_value(node: cst.CSTNode) -> str | None:
    """The text of a plain (non-bytes, non-f) string literal, else None."""
    if isinstance(node, cst.SimpleString) and node.prefix in _ASCII_STR_PREFIXES:
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def keep_parens(original: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    """Carry the parentheses around ``original`` over to its replacement."""
    if getattr(original, "lpar", None) and hasattr(new, "lpar"):
        return new.with_changes(lpar=original.lpar, rpar=original.rpar)
    return new


def positional(call: cst.Call, index: int) -> cst.Arg | None:
    """The ``index``-th positional argument of ``call`` (not counting keywords or ``*args``)."""
    seen = 0
    for arg in call.args:
        if arg.keyword is not None or arg.star:
            continue
        if seen == index:
            return arg
        seen += 1
    return None


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def refuse_unpacked(ctx: PyContext, code: str, call: cst.Call) -> bool:
    """Report ``call`` for a person when some of its arguments are unpacked (``*args``, ``**kwargs``), and say so.

    A rule that reads or adds arguments cannot see what an unpacked mapping holds: ``autocast("cuda", **amp)`` with
    an added ``dtype=`` fails when ``amp`` has one, and ``sdp_kernel(**config)`` read as all-defaults would drop
    the backends ``config`` chooses."""
    if not any(arg.star for arg in call.args):
        return False
    ctx.report(code, call, f"{source(call)}: arguments passed with * or **: rewrite it by hand", fixable=False)
    return True


def arg_position(call: cst.Call, arg: cst.Arg) -> int:
    for i, candidate in enumerate(call.args):
        if candidate is arg:
            return i
    raise ValueError("argument is not in the call")


class LostArgument(LookupError):
    """An argument of the original call that an earlier edit of the same call removed or moved out of reach."""


def updated_index(original: cst.Call, updated: cst.Call, arg: cst.Arg) -> int:
    """Where ``arg``, an argument of ``original``, is in ``updated``: the same call after the edits of the rules
    that left it before (positions re-read, never carried over). Several rules edit one call
    (``init_process_group(backend="cuda:nccl,cpu:gloo", device_id=device)``: TPU401 drops the backend, TPU407
    rewrites the device id), so an index into ``original.args`` may point past the end of ``updated.args``.
    A keyword is found by its name; otherwise, while the call has as many arguments as before, the argument is
    where it was (an earlier edit may have made a keyword positional); a positional argument by its rank among
    the positional ones while their number is unchanged. :class:`LostArgument` otherwise (the engine then drops
    this one edit and says so)."""
    if arg.keyword is not None:
        name = arg.keyword.value
        for i, candidate in enumerate(updated.args):
            if candidate.keyword is not None and candidate.keyword.value == name:
                return i
    position = arg_position(original, arg)
    if len(original.args) == len(updated.args):
        return position
    if arg.keyword is None and not arg.star:
        before = [i for i, a in enumerate(original.args) if a.keyword is None and not a.star]
        after = [i for i, a in enumerate(updated.args) if a.keyword is None and not a.star]
        if len(before) == len(after):
            return after[before.index(position)]
    raise LostArgument(f"{arg_source(arg)} is no longer where it was: an earlier edit of the same call moved it")


def replace_original_arg(original: cst.Call, updated: cst.Call, arg: cst.Arg, value: cst.BaseExpression) -> cst.Call:
    """``updated`` with the value of the argument that was ``arg`` in ``original`` replaced (see
    :func:`updated_index`)."""
    return replace_arg_value(updated, updated_index(original, updated, arg), value)


def drop_original_args(original: cst.Call, updated: cst.Call, dropped: Sequence[cst.Arg]) -> cst.Call:
    """``updated`` without the arguments that were ``dropped`` in ``original`` (see :func:`updated_index`)."""
    indexes = {updated_index(original, updated, arg) for arg in dropped}
    return drop_args(updated, lambda i, a: i in indexes)


def replace_arg_value(call: cst.Call, index: int, value: cst.BaseExpression) -> cst.Call:
    """``call`` with the value of its ``index``-th argument (an index into ``call.args``) replaced."""
    args = list(call.args)
    args[index] = args[index].with_changes(value=value)
    return call.with_changes(args=args)


def drop_args(call: cst.Call, drop: Callable[[int, cst.Arg], bool]) -> cst.Call:
    """``call`` without the arguments ``drop`` selects, keeping the layout of what remains.

    When the last argument goes, the new last argument inherits its trailing comma and whitespace, so
    ``f(a, b=1)`` becomes ``f(a)`` and a one-argument-per-line call keeps its closing line.
    """
    args = list(call.args)
    kept = [arg for i, arg in enumerate(args) if not drop(i, arg)]
    if len(kept) == len(args):
        return call
    if kept and drop(len(args) - 1, args[-1]):
        last = args[-1]
        kept[-1] = kept[-1].with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
    return call.with_changes(args=kept)


def call(func: cst.BaseExpression, args: Sequence[cst.Arg] = ()) -> cst.Call:
    """A call with ``args`` separated by ``", "`` (new code; existing calls keep their own layout)."""
    return cst.Call(func=func, args=_call_args(args))


def kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )


def prepend_args(call: cst.Call, new_args: Sequence[cst.Arg]) -> cst.Call:
    """``call`` with ``new_args`` put in front of its existing arguments (whose layout stays as it was)."""
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    fresh = [arg.with_changes(comma=comma) for arg in new_args]
    if not call.args:
        fresh[-1] = fresh[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=[*fresh, *call.args])


def append_args(call: cst.Call, new_args: Sequence[cst.Arg]) -> cst.Call:
    """``call`` with ``new_args`` after its existing arguments; a trailing comma already there is kept."""
    if not call.args:
        return call.with_changes(args=list(_call_args(new_args)))
    args = list(call.args)
    last = args[-1]
    trailing = last.comma
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    fresh = list(_call_args(new_args))
    fresh[-1] = fresh[-1].with_changes(comma=trailing)
    return call.with_changes(args=[*args, *fresh])


def _call_args(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    out = [arg.with_changes(comma=comma) for arg in args]
    if out:
        out[-1] = out[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return out


_EMPTY_MODULE = cst.Module(body=[])


def source(node: cst.CSTNode) -> str:
    """The code of ``node`` on one line, for messages."""
    return " ".join(_EMPTY_MODULE.code_for_node(node).split())


def arg_source(arg: cst.Arg) -> str:
    """``name=value`` or ``value`` of one argument, without its comma."""
    return source(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT))


# Calls that only read state; an ``if`` testing nothing else can go once its body is gone.
PURE_CALLS = frozenset(
    {
        "torch.cuda.is_available",
        "torch.cuda.device_count",
        "torch.accelerator.is_available",
        "torch.accelerator.device_count",
        "torch.distributed.is_available",
        "torch.distributed.is_initialized",
        "torch.distributed.get_backend",
        "torch.distributed.get_rank",
        "torch.distributed.get_world_size",
        "os.environ.get",
        "os.getenv",
    }
)
_PURE_BUILTINS = frozenset({"len", "isinstance", "hasattr", "bool"})
_PURE_LEAVES = (cst.Name, cst.SimpleString, cst.Integer, cst.Float, cst.Imaginary)


def is_pure(ctx: PyContext, node: cst.CSTNode) -> bool:
    """True when evaluating the expression ``node`` (an original node) changes nothing: names, attribute
    reads, literals, comparisons, ``and``/``or``/``not`` and calls of :data:`PURE_CALLS` with pure arguments."""
    if isinstance(node, _PURE_LEAVES):
        return True
    if isinstance(node, cst.Attribute):
        return is_pure(ctx, node.value)
    if isinstance(node, cst.Comparison):
        return is_pure(ctx, node.left) and all(is_pure(ctx, target.comparator) for target in node.comparisons)
    if isinstance(node, cst.BooleanOperation):
        return is_pure(ctx, node.left) and is_pure(ctx, node.right)
    if isinstance(node, cst.UnaryOperation):
        return is_pure(ctx, node.expression)
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(isinstance(el, cst.Element) and is_pure(ctx, el.value) for el in node.elements)
    if isinstance(node, cst.Call):
        func = node.func
        known = ctx.qualname(func) in PURE_CALLS or (
            isinstance(func, cst.Name) and func.value in _PURE_BUILTINS and func.value not in ctx.aliases
        )
        return known and all(not arg.star and is_pure(ctx, arg.value) for arg in node.args)
    return False
