"""Porting pitfalls reported in public code around TorchTPU, none of them CUDA API: code that runs on a GPU and
fails only on a TPU (TorchTitan's TPU workaround modules, vLLM's TorchTPU notes, bug notes against torch_tpu 0.1-0.2).

Each is a rule of the family its subject belongs to (device binding: cuda-api; collectives: distributed; model
code and libraries: third-party). All are MANUAL reports with the line and what to write instead; none is
rewritten, because none has a rewrite the tool can check locally:

* TPU220 ``torch.tpu.set_device(local_rank)``: the process is already bound to its one device.
* TPU420 a ``.tolist()``/``.item()`` whose value sizes an ``all_to_all`` (MoE token routing): found here, in the
  source, because only the source shows that the host read feeds the collective's split sizes; a profile sees
  a host sync and a collective, not that one sizes the other.
* TPU821 antialiased resizing (``interpolate(..., antialias=True)``, torchvision's resize).
* TPU822 ``is_torch_tpu_available`` (transformers): it meant torch_xla in older releases.

Complex rotary embeddings are :mod:`.complex_rotary`'s (TPU820, TPU823); ``torch.compile(mode=...)`` with the
tpu backend and ``backend="inductor"`` on TPU are TPU501's (compile).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.cstnodes import TreeReader
from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules import cuda_api, distributed, third_party
from tpu_agent.migrate.rules._cst import keyword
from tpu_agent.migrate.rules.references import ACCELERATOR, DISTRIBUTED, TORCH_TPU

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

_PYTORCH = "https://docs.pytorch.org/docs/stable"
INTERPOLATE = f"{_PYTORCH}/generated/torch.nn.functional.interpolate.html"
ALL_TO_ALL = f"{_PYTORCH}/distributed.html#torch.distributed.all_to_all_single"
TRANSFORMERS_IMPORT_UTILS = "https://huggingface.co/docs/transformers/main/en/internal/import_utils"

_SET_DEVICE = (
    "TorchTPU binds each process to one device, seen as tpu:0: torch.tpu.set_device with any other index raises "
    "'current process is bound to device index 0', and called from user code it is internal to TorchTPU. Delete "
    "the call (the launcher already bound the device), or check with torch.accelerator.current_device_index()"
)
_HOST_READ_SPLITS = (
    "a host read of group sizes right before a collective: on TorchTPU it drains the deferred queue at that "
    "point on each rank, and ranks that reach it at different points run different collectives (multi-host runs "
    "deadlock). Exchange the counts with a collective first and read them at one point of the step on every "
    "rank, or keep sizes on device: fixed-capacity (padded) all_to_all, or torch.tpu.ops.ragged_all_to_all"
)
_ANTIALIAS = (
    "antialiased bilinear resizing (aten::_upsample_bilinear2d_aa) is not implemented for tpu: resize on the CPU "
    "(in the data pipeline, before .to('tpu')), or pass antialias=False on tpu tensors"
)
_TPU_AVAILABLE = (
    "is_torch_tpu_available meant torch_xla in older transformers releases (and still does in many trainers), "
    "not TorchTPU: for TorchTPU check torch.accelerator.current_accelerator().type == 'tpu'; for torch_xla use "
    "is_torch_xla_available"
)

cuda_api.FAMILY.rule(
    code="TPU220",
    name="tpu-set-device-per-rank",
    safety=Safety.MANUAL,
    summary="torch.tpu.set_device(local_rank): binding a rank's device by index on TorchTPU.",
    rationale=_SET_DEVICE + ".",
    before="torch.tpu.set_device(local_rank)",
    after="# the process is already bound to its device (tpu:0): nothing to set",
    references=(ACCELERATOR, TORCH_TPU),
    apis=(ApiEquivalent("torch.tpu.set_device(local_rank)", "delete it (one device per process, tpu:0)"),),
)
distributed.FAMILY.rule(
    code="TPU420",
    name="host-read-split-sizes",
    safety=Safety.MANUAL,
    summary=".tolist()/.item() whose value sizes an all_to_all (MoE group sizes read on the host before the "
    "collective).",
    rationale="This is " + _HOST_READ_SPLITS + ".",
    before="splits = counts.tolist()\ndist.all_to_all_single(out, tokens, splits, splits)",
    after="dist.all_to_all_single(out, padded_tokens)  # fixed capacity per expert, sizes stay on device",
    references=(ALL_TO_ALL, DISTRIBUTED, TORCH_TPU),
    apis=(
        ApiEquivalent(
            "dist.all_to_all_single(out, x, counts.tolist(), ...)",
            "fixed-capacity all_to_all_single, or torch.tpu.ops.ragged_all_to_all",
        ),
    ),
)
third_party.FAMILY.rule(
    code="TPU821",
    name="antialias-resize",
    safety=Safety.MANUAL,
    summary="interpolate(..., antialias=True) and torchvision's resize (antialiased by default).",
    rationale="Bug notes against torch_tpu 0.1-0.2: " + _ANTIALIAS + ".",
    before='y = F.interpolate(x, size=(224, 224), mode="bilinear", antialias=True)',
    after='y = F.interpolate(x, size=(224, 224), mode="bilinear", antialias=False)',
    references=(INTERPOLATE, TORCH_TPU),
    apis=(ApiEquivalent("F.interpolate(..., antialias=True), torchvision Resize", _ANTIALIAS),),
)
third_party.FAMILY.rule(
    code="TPU822",
    name="is-torch-tpu-available",
    safety=Safety.MANUAL,
    summary="transformers' is_torch_tpu_available (torch_xla in older releases).",
    rationale=_TPU_AVAILABLE[0].upper() + _TPU_AVAILABLE[1:] + ".",
    before="if is_torch_tpu_available():\n    import torch_xla.core.xla_model as xm",
    after='if torch.accelerator.current_accelerator().type == "tpu":  # TorchTPU',
    references=(TRANSFORMERS_IMPORT_UTILS, ACCELERATOR),
    apis=(ApiEquivalent("transformers.is_torch_tpu_available()", _TPU_AVAILABLE),),
)


@cuda_api.FAMILY.reference("torch.tpu.set_device")
def tpu_set_device_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    ctx.report("TPU220", original, f"{qualname}: {_SET_DEVICE}")
    return updated


@third_party.FAMILY.reference(
    "transformers.is_torch_tpu_available",
    "transformers.utils.is_torch_tpu_available",
    "transformers.utils.import_utils.is_torch_tpu_available",
)
def tpu_available_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    ctx.report("TPU822", original, f"{qualname}: {_TPU_AVAILABLE}")
    return updated


_INTERPOLATE = frozenset({"torch.nn.functional.interpolate", "torch.nn.functional.upsample"})
# torchvision's resize antialiases tensors by default (antialias=True since 0.17)
_TORCHVISION_RESIZE = frozenset(
    {
        f"torchvision.transforms.{path}"
        for path in ("Resize", "functional.resize", "v2.Resize", "v2.functional.resize", "RandomResizedCrop")
    }
    | {"torchvision.transforms.v2.RandomResizedCrop"}
)


def _is_name(node: cst.BaseExpression | None, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


@third_party.FAMILY.leave(cst.Call)
def antialias_call(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    qualname = ctx.qualname(original.func)
    flag = keyword(original, "antialias")
    antialias = flag.value if flag is not None else None
    if (qualname in _INTERPOLATE and _is_name(antialias, "True")) or (
        qualname in _TORCHVISION_RESIZE and not _is_name(antialias, "False")
    ):
        ctx.report("TPU821", original, f"{qualname}: {_ANTIALIAS}")
    return updated


# all_to_all calls and the positions of their output/input split sizes (also accepted by keyword, _SPLIT_KEYWORDS)
_ALL_TO_ALL = {
    "torch.distributed.all_to_all_single": (2, 3),
    "torch.distributed.nn.functional.all_to_all_single": (2, 3),
    "torch.distributed._functional_collectives.all_to_all_single": (1, 2),
    "torch.distributed._functional_collectives.all_to_all_single_autograd": (1, 2),
}
_SPLIT_KEYWORDS = frozenset({"output_split_sizes", "input_split_sizes"})
_HOST_READS = frozenset({"tolist", "item"})


class _SplitSizes(TreeReader):
    """In one function: the host reads assigned to plain names, and the names passed as an all_to_all's sizes."""

    def __init__(self, ctx: PyContext) -> None:
        self.ctx = ctx
        self.reads: dict[str, list[cst.Call]] = {}
        self.sizes: set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # a nested function is visited on its own

    def visit_Assign(self, node: cst.Assign) -> None:
        reads = _host_reads(node.value)
        if reads:
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    self.reads.setdefault(target.target.value, []).extend(reads)

    def visit_Call(self, node: cst.Call) -> None:
        positions = _ALL_TO_ALL.get(self.ctx.qualname(node.func) or "")
        if positions is None:
            return
        for index, arg in enumerate(node.args):
            keyword = arg.keyword.value if arg.keyword is not None else None
            sizes = keyword in _SPLIT_KEYWORDS if keyword is not None else index in positions
            if sizes and isinstance(arg.value, cst.Name):
                self.sizes.add(arg.value.value)


def _host_reads(node: cst.CSTNode) -> list[cst.Call]:
    """The ``.tolist()``/``.item()`` calls in ``node``."""
    found: list[cst.Call] = []

    class Reads(TreeReader):
        def visit_Call(self, call: cst.Call) -> None:
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value in _HOST_READS and not call.args:
                found.append(call)

    node.visit(Reads())
    return found


@distributed.FAMILY.leave(cst.FunctionDef)
def host_read_split_sizes(ctx: PyContext, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
    if not ctx.mentions("all_to_all"):
        return updated
    found = _SplitSizes(ctx)
    original.body.visit(found)
    for name in sorted(found.sizes & found.reads.keys()):
        for read in found.reads[name]:
            method = read.func.attr.value if isinstance(read.func, cst.Attribute) else "tolist"
            ctx.report("TPU420", read, f"{name} (from .{method}()) sizes an all_to_all: {_HOST_READ_SPLITS}")
    return updated
