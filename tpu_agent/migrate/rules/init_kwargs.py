"""What init_process_group is given: a ``device_id`` with the process's device and its index (TPU407), and the
backend and device_id a mapping unpacked into the call carries (TPU401, TPU407).

``**pg_kw`` after ``pg_kw = {"backend": "nccl", "device_id": torch.device("cuda", local_rank)}`` (or
``dict(...)``, or ``pg_kw["device_id"] = ...``) hides those arguments from the call's own rules, and the device
rules would turn the CUDA device into DEVICE, which has no index: the entries are this module's as a whole. They
are rewritten only where :mod:`~tpu_agent.migrate.analysis.unpacked` shows every entry of the mapping; otherwise
the entries and the call are left for a person, with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules._backend import fix_backend_value, is_nccl_backend
from tpu_agent.migrate.rules._cst import (
    keyword,
    replace_arg_value,
    replace_original_arg,
    source,
    string_value,
    updated_index,
)
from tpu_agent.migrate.rules.accelerator_guards import already_guarded, availability_call, not_tpu
from tpu_agent.migrate.rules.devices import known_cuda_index
from tpu_agent.migrate.rules.distributed import FAMILY, INITS
from tpu_agent.migrate.rules.references import DISTRIBUTED

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

FAMILY.rule(
    code="TPU407",
    name="device-id-index",
    safety=Safety.SAFE,
    summary="init_process_group(device_id=...) given a device without an index, a rank, or a CUDA device, directly "
    "or in a mapping unpacked with **.",
    rationale="torch raises 'Please use a device_id with index' for a device without an index, and under TorchTPU an "
    "integer or a CUDA index other than the bound one fails. The process's own device, with the index the "
    "process is bound to, is what every backend accepts (on CUDA it is the device set_device_index selected). "
    "Where the CUDA device names its index (local_rank), CUDA keeps it: evaluated before set_device, the current "
    "index would be another rank's GPU. For the accelerator target it is None where no accelerator is present: "
    "there current_device_index() raises and gloo takes no device_id. A device_id in a mapping unpacked into the "
    "call (**pg_kw) is rewritten where the module shows every entry of the mapping, and left for a person where it "
    "does not.",
    before='dist.init_process_group(backend="nccl", device_id=torch.device(f"cuda:{local_rank}"))',
    after="dist.init_process_group(backend=..., device_id=torch.device(DEVICE.type, local_rank "
    'if DEVICE.type != "tpu" else torch.accelerator.current_device_index()) '
    "if torch.accelerator.is_available() else None)",
    references=(f"{DISTRIBUTED}#torch.distributed.init_process_group",),
    apis=(
        ApiEquivalent(
            "init_process_group(..., device_id=device)",
            "device_id=torch.device(DEVICE.type, torch.accelerator.current_device_index())",
        ),
        ApiEquivalent(
            'init_process_group(..., device_id=torch.device("cuda", local_rank))',
            'device_id=torch.device(DEVICE.type, local_rank if DEVICE.type != "tpu" '
            "else torch.accelerator.current_device_index())",
        ),
        ApiEquivalent(
            'pg_kw = {"device_id": torch.device("cuda", local_rank)}; init_process_group(..., **pg_kw)',
            'pg_kw = {"device_id": torch.device(DEVICE.type, local_rank if DEVICE.type != "tpu" else ...)}',
        ),
    ),
    since_torch="2.7",
)

_DEVICE_ID = "device_id"
_BACKEND = "backend"
_KEYS = frozenset({_DEVICE_ID, _BACKEND})
_INIT_FUNCTION = "init_process_group"


def _is_indexed_current_device(ctx: PyContext, node: cst.BaseExpression) -> bool:
    """``torch.device(<type>, <index>)`` whose index is, or falls back to on TPU, the current device index; alone
    or behind a CPU guard: what this rule writes."""
    if isinstance(node, cst.IfExp):
        node = node.body
    if not (isinstance(node, cst.Call) and ctx.qualname(node) == "torch.device" and len(node.args) == 2):
        return False
    index = node.args[1].value
    if isinstance(index, cst.IfExp):
        index = index.orelse
    return ctx.qualname(index) == "torch.accelerator.current_device_index"


def _process_device_id(ctx: PyContext, index: cst.BaseExpression | None) -> cst.BaseExpression:
    """The process's device with its index: ``torch.device(DEVICE.type, torch.accelerator.current_device_index())``.

    TorchTPU binds one device per process and takes only that index. Where the CUDA device named its own index,
    CUDA keeps it (``local_rank if DEVICE.type != "tpu" else ...``): a mapping built before set_device, or a run
    that never calls it, would otherwise give every rank the current device, GPU 0. For the accelerator target it
    is ``None`` without an accelerator (CPU-only runs), unless an availability test around it ensures one."""
    current: cst.BaseExpression = cst.Call(func=ctx.torch_attr("accelerator.current_device_index"))
    if ctx.target.value == "accelerator" and index is not None:
        current = cst.IfExp(test=not_tpu(ctx), body=index, orelse=current)
    device = cst.Call(func=ctx.torch_attr("device"), args=[cst.Arg(ctx.device_type()), cst.Arg(current)])
    if ctx.target.value != "accelerator" or already_guarded(ctx):
        return device
    return cst.IfExp(test=availability_call(ctx), body=device, orelse=cst.Name("None"))


def _needs_index(ctx: PyContext, value: cst.BaseExpression) -> bool:
    return not _is_indexed_current_device(ctx, value) and not (isinstance(value, cst.Name) and value.value == "None")


def _fix_device_id(ctx: PyContext, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """The process's device for the device_id ``value`` (an original node), or None when not fixed."""
    index = known_cuda_index(ctx, value)
    kept = f"; CUDA keeps index {source(index)}" if index is not None and ctx.target.value == "accelerator" else ""
    return ctx.fix(
        "TPU407",
        value,
        lambda: _process_device_id(ctx, index),
        lambda n: f"device_id={source(value)} -> {source(n)} (a device_id needs an index{kept})",
    )


# ---- mappings unpacked into the call: their backend and device_id entries --------------------------------
def _entries(mapping: cst.BaseExpression) -> list[tuple[str, cst.BaseExpression]]:
    """(key, value) of each backend and device_id entry of a dict display or a ``dict(...)`` call, in order."""
    if isinstance(mapping, cst.Dict):
        keyed = [
            (string_value(element.key), element.value)
            for element in mapping.elements
            if isinstance(element, cst.DictElement)
        ]
    elif isinstance(mapping, cst.Call) and isinstance(mapping.func, cst.Name) and mapping.func.value == "dict":
        keyed = [(arg.keyword.value, arg.value) for arg in mapping.args if arg.keyword is not None]
    else:
        return []
    return [(key, value) for key, value in keyed if key in _KEYS]


def _with_entries(mapping: cst.BaseExpression, values: list[cst.BaseExpression | None]) -> cst.BaseExpression:
    """``mapping`` (updated) with the value of its ``i``-th backend/device_id entry replaced by ``values[i]``
    (kept where None)."""
    position = -1

    def swap(value: cst.BaseExpression) -> cst.BaseExpression:
        nonlocal position
        position += 1
        return values[position] or value

    if isinstance(mapping, cst.Dict):
        return mapping.with_changes(
            elements=[
                element.with_changes(value=swap(element.value))
                if isinstance(element, cst.DictElement) and string_value(element.key) in _KEYS
                else element
                for element in mapping.elements
            ]
        )
    assert isinstance(mapping, cst.Call)  # a dict(...) call: _entries found entries in it
    return mapping.with_changes(
        args=[
            arg.with_changes(value=swap(arg.value)) if arg.keyword is not None and arg.keyword.value in _KEYS else arg
            for arg in mapping.args
        ]
    )


def _fix_entry(
    ctx: PyContext, key: str, value: cst.BaseExpression, via: str, reason: str | None
) -> cst.BaseExpression | None:
    """The new value of one entry of a mapping unpacked into init_process_group (``via`` says how), None to keep
    it; an unresolved mapping (``reason``) has its CUDA entries reported for a person instead."""
    code, needed = ("TPU401", is_nccl_backend(ctx, value)) if key == _BACKEND else ("TPU407", _needs_index(ctx, value))
    if not needed:
        return None
    if reason is not None:
        what = (
            "set its backend for the device in use"
            if key == _BACKEND
            else "give it the process's device with its index"
        )
        message = f"{key}={source(value)} reaches init_process_group through {via}, but {reason}: {what} by hand"
        ctx.report(code, value, message, fixable=False)
        return None
    return fix_backend_value(ctx, value, entry=True) if key == _BACKEND else _fix_device_id(ctx, value)


def _bound_entries(
    ctx: PyContext, node: cst.Assign | cst.AnnAssign
) -> tuple[str, list[tuple[str, cst.BaseExpression]]] | None:
    """(name, its backend/device_id entries) for ``name = {...}`` / ``name = dict(...)`` / ``name["device_id"] =
    value`` where ``name`` is unpacked into init_process_group; else None."""
    if not ctx.mentions(_INIT_FUNCTION) or node.value is None:
        return None
    if isinstance(node, cst.Assign):
        if len(node.targets) != 1:
            return None
        target = node.targets[0].target
    else:
        target = node.target
    unpacked = ctx.unpacked(_INIT_FUNCTION)
    if isinstance(target, cst.Name) and unpacked.is_unpacked(ctx.scope_path, target.value):
        entries = _entries(node.value)
        return (target.value, entries) if entries else None
    if (
        isinstance(target, cst.Subscript)
        and isinstance(target.value, cst.Name)
        and unpacked.is_unpacked(ctx.scope_path, target.value.value)
        and len(target.slice) == 1
        and isinstance(target.slice[0].slice, cst.Index)
        and (key := string_value(target.slice[0].slice.value)) in _KEYS
    ):
        return target.value.value, [(key, node.value)]
    return None


@FAMILY.visit(cst.Assign)
@FAMILY.visit(cst.AnnAssign)
def _claim_bound_entries(ctx: PyContext, node: cst.Assign | cst.AnnAssign) -> None:
    found = _bound_entries(ctx, node)
    for _, value in found[1] if found is not None else ():
        ctx.claim(value)  # this family's as a whole: the device rules would drop a device_id's index


@FAMILY.leave(cst.Assign)
@FAMILY.leave(cst.AnnAssign)
def bound_init_arguments(
    ctx: PyContext, original: cst.Assign | cst.AnnAssign, updated: cst.Assign | cst.AnnAssign
) -> cst.Assign | cst.AnnAssign:
    found = _bound_entries(ctx, original)
    if found is None:
        return updated
    name, entries = found
    reason = ctx.unpacked(_INIT_FUNCTION).reason(ctx.scope_path, name)
    fixes = [_fix_entry(ctx, key, value, f"**{name}", reason) for key, value in entries]
    if not any(fixes):
        return updated
    assert updated.value is not None  # _bound_entries found entries in it
    target = original.targets[0].target if isinstance(original, cst.Assign) else original.target
    if isinstance(target, cst.Subscript):  # name["device_id"] = value
        return updated.with_changes(value=fixes[0])
    return updated.with_changes(value=_with_entries(updated.value, fixes))


# ---- the call -----------------------------------------------------------------------------------------
@FAMILY.visit(cst.Call)
def _claim_inline_entries(ctx: PyContext, node: cst.Call) -> None:
    if ctx.qualname(node.func) in INITS:
        for arg in node.args:
            for _, value in _entries(arg.value) if arg.star == "**" else ():
                ctx.claim(value)


@FAMILY.leave(cst.Call)
def device_id_index(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    if type(updated) is not cst.Call or ctx.qualname(original) not in INITS:
        return updated
    device_id = keyword(original, _DEVICE_ID)
    if device_id is not None and _needs_index(ctx, device_id.value):
        new = _fix_device_id(ctx, device_id.value)
        if new is not None:
            updated = replace_original_arg(original, updated, device_id, new)
    for arg in original.args:
        if arg.star != "**":
            continue
        entries = _entries(arg.value)
        if entries:  # **{"device_id": ...}, **dict(backend=...)
            fixes = [_fix_entry(ctx, key, value, "**{...}", None) for key, value in entries]
            if any(fixes):
                position = updated_index(original, updated, arg)
                updated = replace_arg_value(updated, position, _with_entries(updated.args[position].value, fixes))
            continue
        reason = (
            ctx.unpacked(_INIT_FUNCTION).reason(ctx.scope_path, arg.value.value)
            if isinstance(arg.value, cst.Name)
            else f"{source(arg.value)} is not a name this module binds"
        )
        if reason is not None:
            message = f"**{source(arg.value)} may hold a device_id, but {reason}: "
            ctx.report(
                "TPU407", arg.value, message + "make sure it is the process's device with its index", fixable=False
            )
    return updated
