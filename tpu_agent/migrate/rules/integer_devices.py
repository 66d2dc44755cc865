"""TPU107: a rank used as a device index: ``.to(local_rank)``, ``torch.device(args.gpu)``, ``device=rank``,
``torch.device(cfg.device, local_rank)``, and device-agnostic code's ``torch.device(f"{acc}:{rank}")``; also a
name every binding of which is a rank (DiT's ``device = rank % torch.cuda.device_count()``, then ``.to(device)``).

An integer device is a CUDA index; device-agnostic code builds the same from the accelerator
(pytorch/examples' minGPT-ddp: ``acc = torch.accelerator.current_accelerator()`` then
``torch.device(f"{acc}:{local_rank}")``, ``tpu:1`` on rank 1 under TorchTPU, whose processes each see their one
device as ``tpu:0``). Every form becomes :func:`~tpu_agent.migrate.rules._rank.rank_device`'s: the process's
device on TPU, the rank's indexed device on CUDA and the other accelerators. A name bound to
``f"{device.type}:{args.gpu}"`` and used only as a device (imagenet's ``map_location=loc``) keeps the code's own
``device.type`` as the plain branch. Kept apart from
:mod:`~tpu_agent.migrate.rules.devices` (whose family it belongs to) because that module is long already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.analysis.valueflow import Verdict, name_key
from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules._bound import always_bound_to_call, bound_earlier
from tpu_agent.migrate.rules._cst import (
    drop_args,
    keyword,
    positional,
    replace_arg_value,
    replace_original_arg,
    source,
)
from tpu_agent.migrate.rules._rank import (
    always_bound_to_rank,
    in_place,
    indexed_device,
    is_rank_choice,
    is_rank_index,
    is_rank_value,
    rank_device,
)
from tpu_agent.migrate.rules.devices import FAMILY, cuda_device_code
from tpu_agent.migrate.rules.references import ACCELERATOR, DDP

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

FAMILY.rule(
    code="TPU107",
    name="integer-device",
    safety=Safety.SAFE,
    summary="A process's rank used as a device: .to(local_rank), torch.device(local_rank), device=rank, "
    'torch.device(f"{acc}:{rank}"), .to(device) after device = rank % torch.cuda.device_count().',
    rationale="An integer device means a CUDA index, and device-agnostic code builds the same from the accelerator "
    '(torch.device(f"{acc}:{local_rank}")). TorchTPU binds one device per process and rejects any index other than '
    "the bound one (each rank sees its chip as tpu:0), so on TPU the process's device replaces the index; on CUDA "
    "and the other accelerators the index still selects the rank's device, chosen at run time (--target tpu: the "
    "process's device only).",
    before="model = Net().to(local_rank)\nx = torch.zeros(3, device=torch.device(args.gpu))",
    after='model = Net().to(DEVICE if DEVICE.type in ("cpu", "tpu") else torch.device(DEVICE.type, local_rank))\n'
    'x = torch.zeros(3, device=DEVICE if DEVICE.type in ("cpu", "tpu") else torch.device(DEVICE.type, args.gpu))',
    references=(ACCELERATOR, DDP),
    apis=(
        ApiEquivalent(
            '.to(local_rank), torch.device(local_rank), device=rank, torch.device(f"{acc}:{rank}")',
            'DEVICE if DEVICE.type in ("cpu", "tpu") else torch.device(DEVICE.type, local_rank) (--target tpu: "tpu")',
        ),
        ApiEquivalent(
            'loc = f"{device.type}:{args.gpu}" used only as a device (map_location=loc)',
            'loc = device.type if DEVICE.type in ("cpu", "tpu") else f"{device.type}:{args.gpu}"',
        ),
        ApiEquivalent(
            "torch.device(cfg.device, local_rank)",
            'torch.device(cfg.device) if DEVICE.type in ("cpu", "tpu") else torch.device(cfg.device, local_rank)',
        ),
    ),
)

_CURRENT_ACCELERATOR = "torch.accelerator.current_accelerator"


def _is_accelerator(ctx: PyContext, node: cst.BaseExpression) -> bool:
    """``torch.accelerator.current_accelerator()`` or its ``.type``, directly or through a name bound to it just
    before (``acc = ...``) or an attribute the module only ever binds to it (``self.acc``)."""
    if isinstance(node, cst.Attribute) and node.attr.value == "type":
        node = node.value
    if isinstance(node, cst.Name):
        node = bound_earlier(ctx, node.value) or node
    if isinstance(node, cst.Call):
        return ctx.qualname(node) == _CURRENT_ACCELERATOR
    return always_bound_to_call(ctx, node, _CURRENT_ACCELERATOR)


def _rank_index(ctx: PyContext, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The index a device expression takes from the process (``local_rank`` itself, the ``rank`` of
    ``f"{acc}:{rank}"`` where ``acc`` is the accelerator), else None."""
    if is_rank_value(node) or always_bound_to_rank(ctx, node):
        return node
    parts = _kind_and_index(node)
    if parts is not None and is_rank_index(parts[1]) and _is_accelerator(ctx, parts[0]):
        return parts[1]  # f"{acc}:0" names the device every process is bound to, so only a run-time index
    return None


def _kind_and_index(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """The two expressions of a device string ``f"{kind}:{index}"``, else None."""
    if not isinstance(node, cst.FormattedString) or len(node.parts) != 3:
        return None
    kind, colon, index = node.parts
    if (
        isinstance(kind, cst.FormattedStringExpression)
        and isinstance(colon, cst.FormattedStringText)
        and colon.value == ":"
        and isinstance(index, cst.FormattedStringExpression)
    ):
        return kind.expression, index.expression
    return None


def _integer_device(
    ctx: PyContext, value: cst.BaseExpression, index: cst.BaseExpression, form: str
) -> cst.BaseExpression | None:
    """The device at ``value`` (a rank, or a device string built from one): the process's on TPU, the rank's
    indexed one elsewhere."""
    build = ctx.device if form == "device" else ctx.device_value
    return ctx.fix(
        "TPU107",
        value,
        lambda: rank_device(ctx, build(), lambda: indexed_device(ctx, index)),
        lambda n: f"device index {source(index)} -> {source(n)} (one device per process on TPU)",
    )


@FAMILY.visit(cst.IfExp)
def _claim_rank_choice(ctx: PyContext, node: cst.IfExp) -> None:
    # `... else torch.device(cfg.device, local_rank)`: the indexed branch a migration wrote stays as it is
    if is_rank_choice(ctx, node):
        ctx.claim(node.orelse)


@FAMILY.leave(cst.Call)
def integer_device(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    if type(updated) is not cst.Call or ctx.is_claimed(original):
        return updated
    func = original.func
    qualname = ctx.qualname(original)
    if isinstance(func, cst.Attribute) and func.attr.value == "to" and qualname is None:
        first = positional(original, 0)
        index = _rank_index(ctx, first.value) if first is not None and original.args[0] is first else None
        if first is not None and index is not None:
            new = _integer_device(ctx, first.value, index, "value")
            return replace_arg_value(updated, 0, new) if new is not None else updated
    elif qualname == "torch.device" and len(original.args) == 1:
        index = _rank_index(ctx, original.args[0].value)
        if index is not None:
            new = _integer_device(ctx, original.args[0].value, index, "device")
            return in_place(ctx, original, new) if new is not None else updated
    elif qualname == "torch.device" and len(original.args) == 2:
        return _typed_rank_device(ctx, original, updated)
    device = keyword(original, "device")
    index = _rank_index(ctx, device.value) if device is not None else None
    if device is not None and index is not None:
        new = _integer_device(ctx, device.value, index, "value")
        if new is not None:
            return replace_original_arg(original, updated, device, new)
    return updated


def _typed_rank_device(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    """``torch.device(cfg.device, local_rank)``, ``torch.device(acc, rank)``: the type stays, the index only off
    TPU (``torch.device("cuda", rank)`` is TPU101's)."""
    kind, index = original.args[0].value, original.args[1].value
    if cuda_device_code(ctx, kind) is not None or not (
        is_rank_value(index) or (_is_accelerator(ctx, kind) and is_rank_index(index))
    ):
        return updated
    plain = drop_args(updated, lambda i, a: i == 1)
    new = ctx.fix(
        "TPU107",
        index,
        lambda: rank_device(ctx, plain, lambda: updated),
        lambda n: f"device index {source(index)} of {source(original)} kept off TPU only (one device per process)",
    )
    return in_place(ctx, original, new) if new is not None else updated


@FAMILY.leave(cst.Assign)
def named_rank_device(ctx: PyContext, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
    """``loc = f"{device.type}:{args.gpu}"`` whose every use is a device position (pytorch/examples' imagenet
    passes it as ``torch.load(..., map_location=loc)``): ``tpu:1`` on rank 1 under TorchTPU. The device the string
    names stays the code's own (``device.type``, any device, not DEVICE); only its index goes where DEVICE is a
    one-device-per-process type, which it is exactly when ``device`` is the TPU. A name whose text is also read
    (split, tested, returned) is reported for a person: text that expects the index may break without it."""
    target = original.targets[0].target if len(original.targets) == 1 else None
    parts = _kind_and_index(updated.value)
    if not isinstance(target, cst.Name) or parts is None or _kind_and_index(original.value) is None:
        return updated
    kind, index = parts
    if not (isinstance(kind, (cst.Name, cst.Attribute)) or _is_accelerator(ctx, kind)) or not is_rank_value(index):
        return updated
    flow = ctx.value_flow.flow(name_key(target.value))
    if flow.verdict is Verdict.MIXED and flow.position_lines and flow.other_lines:
        # timm's init_distributed_device: `device = f"{device_type}:{local_rank}"` is also read as text (split on
        # ":", tested with startswith, returned), and text that expects the index may break without it
        lines = ", ".join(map(str, flow.other_lines))
        ctx.report(
            "TPU107",
            original.value,
            f"{target.value} = {source(original.value)} gives the device the rank's index (tpu:1 on rank 1 of a TPU "
            "run), but TorchTPU binds one device per process and each rank sees its chip as tpu:0. Not rewritten: "
            f"{target.value}'s text is also read (line{'s' if len(flow.other_lines) > 1 else ''} {lines}), which may "
            f"expect the index; on TPU, set it to {source(kind)} alone",
            fixable=False,
        )
        return updated
    if flow.verdict is not Verdict.DEVICE:
        return updated
    new = ctx.fix(
        "TPU107",
        original.value,
        lambda: rank_device(ctx, kind, lambda: updated.value),
        lambda n: f"device index {source(index)} of {target.value} kept off TPU only (one device per process)",
    )
    return updated.with_changes(value=new) if new is not None else updated
