"""TPU4xx: process groups and parallel wrappers: ``nccl``, DDP ``device_ids``, device meshes, barriers.

TorchTPU's collective backend is ``tpu_dist`` (``"cpu:gloo,tpu:tpu_dist"`` when CPU-side object collectives
are needed); torch maps each device type to its default backend, so device-agnostic code asks
``torch.distributed.get_default_backend_for_device(DEVICE)``. DDP on TPU takes no ``device_ids``.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules._backend import (
    BACKEND_NCCL,
    NCCL_AVAILABLE,
    check_branches,
    check_call,
    fix_backend,
    fix_backend_value,
    is_nccl,
    is_nccl_backend,
)
from tpu_agent.migrate.rules._base import TEXT_KINDS, Family, TextFix
from tpu_agent.migrate.rules._cst import (
    arg_source,
    drop_original_args,
    keyword,
    positional,
    replace_original_arg,
    source,
    string_value,
    updated_index,
)
from tpu_agent.migrate.rules.devices import rewrite_device
from tpu_agent.migrate.rules.references import DDP, DEVICE_MESH, DISTRIBUTED, TORCH_TPU

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext, TextContext

FAMILY = Family("distributed")

FAMILY.rule(
    code="TPU401",
    name="nccl-backend",
    safety=Safety.SAFE,
    summary='The NCCL backend where a process group is created: init_process_group("nccl"), "cpu:gloo,cuda:nccl", '
    'Backend.NCCL, "nccl" if dist.is_nccl_available() else "gloo", os.environ.get("BACKEND", "nccl"), a --backend '
    "default, a backend variable or config field, a mapping unpacked into init_process_group, a "
    'device-type table {"cuda": "nccl", ...}.',
    rationale="NCCL is CUDA-only; TorchTPU's backend is tpu_dist. "
    "torch.distributed.get_default_backend_for_device(DEVICE) picks nccl, tpu_dist or gloo for the device in use; "
    "omitting the backend gives cpu:gloo plus the accelerator's default, the device-agnostic form of the mixed string.",
    before='dist.init_process_group("nccl")',
    after="dist.init_process_group(torch.distributed.get_default_backend_for_device(DEVICE))",
    references=(DISTRIBUTED, TORCH_TPU),
    since_torch="2.6",
    apis=(
        ApiEquivalent(
            'dist.init_process_group("nccl")',
            "dist.init_process_group(torch.distributed.get_default_backend_for_device(DEVICE)) "
            '(--target tpu: "tpu_dist")',
        ),
    ),
)
FAMILY.rule(
    code="TPU402",
    name="nccl-backend-check",
    safety=Safety.UNSAFE,
    summary='Code that tests for NCCL: dist.get_backend() == "nccl", Backend.NCCL outside init, '
    "dist.is_nccl_available().",
    rationale="On TPU the backend is never nccl, so such branches silently change. The fix compares with the backend "
    "of the device in use, which assumes the branch meant 'the accelerator backend' rather than NCCL itself.",
    before='if dist.get_backend() == "nccl":',
    after="if dist.get_backend() == torch.distributed.get_default_backend_for_device(DEVICE):",
    references=(DISTRIBUTED,),
    since_torch="2.6",
    apis=(
        ApiEquivalent(
            'dist.get_backend() == "nccl", dist.is_nccl_available()',
            "dist.get_backend() == torch.distributed.get_default_backend_for_device(DEVICE)",
        ),
    ),
)
FAMILY.rule(
    code="TPU403",
    name="ddp-device-ids",
    safety=Safety.SAFE,
    summary="DistributedDataParallel(model, device_ids=[...], output_device=...).",
    rationale="TorchTPU's DDP takes no device_ids (integer ids mean CUDA devices); for a module on one device DDP "
    "infers the device from the module on every backend, CUDA included.",
    before="DDP(model, device_ids=[local_rank], output_device=local_rank)",
    after="DDP(model)",
    references=(DDP,),
    apis=(
        ApiEquivalent(
            "DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)",
            "DistributedDataParallel(model)",
        ),
    ),
)
FAMILY.rule(
    code="TPU404",
    name="device-mesh-cuda",
    safety=Safety.SAFE,
    summary='A CUDA device mesh: init_device_mesh("cuda", shape), DeviceMesh("cuda", ...).',
    rationale="Device meshes name the device type; TorchTPU meshes are 'tpu' meshes.",
    before='mesh = init_device_mesh("cuda", (world_size,))',
    after="mesh = init_device_mesh(DEVICE.type, (world_size,))",
    references=(DEVICE_MESH,),
    apis=(
        ApiEquivalent(
            'init_device_mesh("cuda", shape), DeviceMesh("cuda", ...)',
            "init_device_mesh(DEVICE.type, shape)",
        ),
    ),
)
FAMILY.rule(
    code="TPU405",
    name="barrier-device-ids",
    safety=Safety.SAFE,
    summary="dist.barrier(device_ids=[...]).",
    rationale="device_ids is an NCCL-only barrier option; TorchTPU rejects it (except [0]).",
    before="dist.barrier(device_ids=[local_rank])",
    after="dist.barrier()",
    references=(DISTRIBUTED,),
    apis=(ApiEquivalent("dist.barrier(device_ids=[local_rank])", "dist.barrier()"),),
)

FAMILY.rule(
    code="TPU406",
    name="data-parallel",
    safety=Safety.MANUAL,
    summary="torch.nn.DataParallel (single-process, multi-GPU).",
    rationale="DataParallel replicates a module over CUDA devices in one process; TorchTPU runs one device per "
    "process, so the TPU path is DistributedDataParallel (or FSDP2) launched with one process per chip.",
    before="model = nn.DataParallel(model, device_ids=[0, 1])",
    after="model = DDP(model)  # launched with torchrun / tpu-agent run --nproc N",
    references=(DDP,),
    apis=(
        ApiEquivalent("torch.nn.DataParallel(model)", "DistributedDataParallel(model) or FSDP2, one process per chip"),
    ),
)

_DATA_PARALLEL = (
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
    # the functional form, e.g. pytorch/examples' DCGAN: nn.parallel.data_parallel(self.main, input, range(ngpu))
    "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.data_parallel.data_parallel",
)
INITS = frozenset(
    {
        "torch.distributed.init_process_group",
        "torch.distributed.distributed_c10d.init_process_group",
        "torch.distributed.new_group",
        "torch.distributed.distributed_c10d.new_group",
    }
)
_DDPS = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
)
_MESHES = frozenset(
    {
        "torch.distributed.device_mesh.init_device_mesh",
        "torch.distributed.device_mesh.DeviceMesh",
        "torch.distributed.DeviceMesh",
        "torch.distributed.init_device_mesh",
        # DTensor's package re-exports both (what DTensor and FSDP2 tests import them from)
        "torch.distributed.tensor.init_device_mesh",
        "torch.distributed.tensor.DeviceMesh",
        "torch.distributed._tensor.init_device_mesh",
        "torch.distributed._tensor.DeviceMesh",
    }
)
_BARRIERS = frozenset({"torch.distributed.barrier", "torch.distributed.distributed_c10d.barrier"})
FAMILY.claim(*INITS, *_DDPS, *_MESHES, *_BARRIERS)
_BACKEND_NAME_RE = re.compile(r"backend$", re.IGNORECASE)


@FAMILY.visit(cst.Call)
def _claim_init_backend(ctx: PyContext, node: cst.Call) -> None:
    if ctx.qualname(node.func) in INITS:
        backend = positional(node, 0) or keyword(node, "backend")
        if backend is not None:
            ctx.claim(backend.value)


@FAMILY.visit(cst.IfExp)
def _claim_backend_check(ctx: PyContext, node: cst.IfExp) -> None:
    # "nccl" if dist.is_nccl_available() else "gloo" is one backend expression: its check is not reported apart
    if is_nccl_backend(ctx, node) and check_branches(ctx, node) is not None:
        ctx.claim(check_call(node))
        ctx.claim(check_call(node).func)


@FAMILY.leave(cst.Call)
def distributed_call(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    qualname = ctx.qualname(original)
    if qualname in INITS:
        backend = positional(original, 0) or keyword(original, "backend")
        if backend is None:
            return updated
        return _replace_backend(ctx, original, updated, backend) or updated
    if qualname in _DDPS:
        dropped = [
            arg
            for i, arg in enumerate(original.args)
            if (arg.keyword is not None and arg.keyword.value in ("device_ids", "output_device"))
            or (arg.keyword is None and not arg.star and i in (1, 2))
        ]
        if dropped and ctx.report("TPU403", original, f"removed {', '.join(arg_source(a) for a in dropped)}"):
            return drop_original_args(original, updated, dropped)
        return updated
    if qualname in _BARRIERS:
        ids = keyword(original, "device_ids")
        if ids is not None and ctx.report("TPU405", original, f"removed {arg_source(ids)}"):
            return drop_original_args(original, updated, [ids])
        return updated
    if qualname in _MESHES:
        device = positional(original, 0) or keyword(original, "device_type")
        if device is not None:
            new = rewrite_device(ctx, device.value, "type", code="TPU404")
            if new is not None:
                return replace_original_arg(original, updated, device, new)
        return updated
    if qualname in NCCL_AVAILABLE and not ctx.is_claimed(original):
        new = ctx.fix(
            "TPU402",
            original,
            lambda: cst.Call(
                func=ctx.torch_attr("distributed.is_backend_available"), args=[cst.Arg(ctx.default_backend())]
            ),
            lambda n: f"{source(original)} -> {source(n)}",
        )
        return new if new is not None else updated
    if isinstance(original.func, cst.Attribute) and original.func.attr.value == "add_argument":
        return _argparse_backend(ctx, original, updated)
    return updated


def _replace_backend(ctx: PyContext, original: cst.Call, updated: cst.Call, backend: cst.Arg) -> cst.Call | None:
    if not is_nccl_backend(ctx, backend.value):
        return None
    new = fix_backend(ctx, backend.value, updated.args[updated_index(original, updated, backend)].value)
    if new is None:
        return None
    if new.value is None:
        return drop_original_args(original, updated, [backend])
    return replace_original_arg(original, updated, backend, new.value)


def _argparse_backend(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.Call:
    flags = [string_value(arg.value) or "" for arg in original.args if arg.keyword is None]
    if not any("backend" in flag for flag in flags):
        return updated
    default = keyword(original, "default")
    if default is None or not is_nccl_backend(ctx, default.value):
        return updated
    new = fix_backend_value(ctx, default.value, updated.args[updated_index(original, updated, default)].value)
    return replace_original_arg(original, updated, default, new) if new is not None else updated


@FAMILY.leave(cst.Assign)
def backend_variable(ctx: PyContext, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
    names = [t.target for t in original.targets]
    if not all(isinstance(n, cst.Name) and _BACKEND_NAME_RE.search(n.value) for n in names):
        return updated
    if not is_nccl_backend(ctx, original.value):
        return updated
    new = fix_backend_value(ctx, original.value, updated.value)
    return updated.with_changes(value=new) if new is not None else updated


@FAMILY.visit(cst.Subscript)
def _claim_indexed_table(ctx: PyContext, node: cst.Subscript) -> None:
    # {"cuda": "nccl", "cpu": "gloo"}[device.type] is value_flow's backend_table's, as a whole
    if isinstance(node.value, cst.Dict):
        ctx.claim(node.value)


@FAMILY.leave(cst.Dict)
def backend_table_entry(ctx: PyContext, original: cst.Dict, updated: cst.Dict) -> cst.Dict:
    """A table from device type to backend (timm's ``{"xpu": "ccl", "cuda": "nccl", "npu": "hccl"}.get(
    device_type, "gloo")``): without a "tpu" entry a TPU run takes the gloo fallback, whose collectives do not
    run on TPU tensors. The entry goes in after the "cuda" one; the table keeps working on every other device."""
    if ctx.is_claimed(original):
        return updated
    elements = list(updated.elements)
    keys = [string_value(e.key) if isinstance(e, cst.DictElement) else None for e in original.elements]
    if "tpu" in keys or "cuda" not in keys:
        return updated
    at = keys.index("cuda")
    cuda = original.elements[at]
    if not isinstance(cuda, cst.DictElement) or not is_nccl(ctx, cuda.value):
        return updated

    def build() -> cst.Dict:
        # the new entry takes the "cuda" entry's comma (a last entry's holds the layout before the brace)
        comma = elements[at - 1].comma if at == len(elements) - 1 and at > 0 else elements[at].comma
        if not isinstance(comma, cst.Comma):
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        entry = cst.DictElement(ctx.string("tpu"), ctx.string("tpu_dist"), comma=elements[at].comma)
        return updated.with_changes(
            elements=[*elements[:at], elements[at].with_changes(comma=comma), entry, *elements[at + 1 :]]
        )

    new = ctx.fix("TPU401", cuda, build, lambda n: 'device-type table "cuda": "nccl" gains "tpu": "tpu_dist"')
    return new if isinstance(new, cst.Dict) else updated


@FAMILY.visit(cst.Comparison)
def _claim_compared_backend(ctx: PyContext, node: cst.Comparison) -> None:
    for comparison in node.comparisons:
        if ctx.qualname(comparison.comparator) in BACKEND_NCCL:
            ctx.claim(comparison.comparator)


@FAMILY.leave(cst.Comparison)
def backend_comparison(ctx: PyContext, original: cst.Comparison, updated: cst.Comparison) -> cst.Comparison:
    targets = list(updated.comparisons)
    changed = False
    sides = [original.left, *(c.comparator for c in original.comparisons)]
    for i, comparison in enumerate(original.comparisons):
        if not isinstance(comparison.operator, (cst.Equal, cst.NotEqual, cst.In, cst.NotIn)):
            continue
        value = comparison.comparator
        other = sides[i]
        if is_nccl(ctx, value) or (
            isinstance(value, (cst.List, cst.Tuple, cst.Set)) and any(is_nccl(ctx, e.value) for e in value.elements)
        ):
            if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
                elements = list(targets[i].comparator.elements)  # type: ignore[attr-defined]

                def build_list(
                    elements: list[cst.BaseElement] = elements, value: cst.BaseExpression = value
                ) -> cst.BaseExpression:
                    out = [
                        el.with_changes(value=ctx.default_backend(el.value)) if is_nccl(ctx, orig.value) else el
                        for el, orig in zip(elements, value.elements, strict=True)  # type: ignore[attr-defined]
                    ]
                    return targets[i].comparator.with_changes(elements=out)  # noqa: B023 - ctx.fix calls it at once

                new = ctx.fix("TPU402", value, build_list, lambda n: f"{source(original)}: nccl -> {source(n)}")
            else:
                new = ctx.fix(
                    "TPU402",
                    value,
                    functools.partial(ctx.default_backend, value),
                    lambda n: f"{source(original)}: nccl -> {source(n)}",
                )
            if new is not None:
                targets[i] = targets[i].with_changes(comparator=new)
                changed = True
        elif is_nccl(ctx, other) and i == 0:
            new = ctx.fix(
                "TPU402",
                other,
                functools.partial(ctx.default_backend, other),
                lambda n: f"{source(original)}: nccl -> {source(n)}",
            )
            if new is not None:
                return updated.with_changes(left=new, comparisons=targets)
    return updated.with_changes(comparisons=targets) if changed else updated


@FAMILY.reference(*BACKEND_NCCL)
def backend_nccl_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    new = ctx.fix("TPU402", original, lambda: ctx.default_backend(), lambda n: f"Backend.NCCL -> {source(n)}")
    return new if new is not None else updated


DATA_PARALLEL_RECIPE = (
    "DataParallel drives several GPUs from one process; TorchTPU runs one device per process. Port to DDP: "
    "launch N processes (`tpu-agent run --nproc N train.py` or torchrun), call "
    "dist.init_process_group(backend=dist.get_default_backend_for_device(DEVICE)), wrap "
    "DistributedDataParallel(model.to(DEVICE)) without device_ids, shard the data with DistributedSampler, and "
    "divide the global batch size by the number of processes"
)


@FAMILY.reference(*_DATA_PARALLEL)
def data_parallel_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    ctx.report("TPU406", original, DATA_PARALLEL_RECIPE)
    return updated


# ---- launch scripts and configs -----------------------------------------------------------------------
def _backend_replace(ctx: TextContext, match: re.Match[str]) -> str | None:
    return "tpu_dist" if ctx.target.value == "tpu" else None


def _backend_message(ctx: TextContext, match: re.Match[str]) -> str:
    if ctx.target.value == "tpu":
        return "backend nccl -> tpu_dist"
    return "backend nccl: pass the accelerator's backend (tpu_dist on TPU) or rerun with --target tpu"


FAMILY.text(
    TextFix(
        code="TPU401",
        kinds=TEXT_KINDS,
        pattern=re.compile(
            r"(?:(?<=--backend[= ])|(?<=--dist-backend[= ])|(?<=--dist_backend[= ])|(?<=\bbackend: )"
            r"|(?<=\bdist_backend: )|(?<=\bBACKEND=))nccl\b"
        ),
        replace=_backend_replace,
        message=_backend_message,
    )
)
