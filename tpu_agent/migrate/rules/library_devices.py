"""Devices handed to libraries by name (TPU101 rewrites, TPU109 reports): Hugging Face ``device_map`` and
``max_memory``, Lightning's ``accelerator=``.

``from_pretrained(..., device_map="cuda")`` and a device map that puts every module on one CUDA device
(``{"": "cuda:0"}``, a test's ``{"lm_head.weight": "cuda:0", ...}``) name the one device a process uses: the
strings are device values like any ``device=`` argument (transformers turns a string or a ``torch.device`` into
``{"": torch.device(...)}``). A map over several CUDA devices, ``max_memory`` budgets per CUDA device, and
Lightning's ``accelerator="cuda"``/``"gpu"`` have no TorchTPU form: a person decides (TPU109).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules import devices
from tpu_agent.migrate.rules._cst import arg_source, keyword, replace_original_arg, source, string_value, updated_index
from tpu_agent.migrate.rules.devices import cuda_device_code, rewrite_device
from tpu_agent.migrate.rules.references import FSDP2, TORCH_TPU

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

LIGHTNING_ACCELERATORS = "https://lightning.ai/docs/pytorch/stable/extensions/accelerator.html"
ACCELERATE_DISCOVERY = "https://github.com/huggingface/accelerate/issues/3813"

devices.FAMILY.rule(
    code="TPU109",
    name="library-cuda-placement",
    safety=Safety.MANUAL,
    summary='A library told to place work on CUDA by name: Lightning Trainer/Fabric(accelerator="cuda" or "gpu") and '
    "Lightning accelerator names in a module built on it, a Hugging Face device_map over several CUDA devices, "
    "max_memory budgets for CUDA devices, a map of module names to CUDA devices (a test's expected placement), a "
    'custom op registered for CUDA only (torch.library.custom_op(..., device_types="cuda")).',
    rationale="Lightning's 'tpu' accelerator is torch_xla's and its 'auto' finds no TorchTPU device, so the run "
    "would train on the CPU; Accelerate's device discovery does not know TorchTPU's device either. A device map "
    "over several GPUs places layers per device, where TorchTPU runs one device per process: shard with FSDP2 "
    "(or keep one device) instead. A custom op registered for CUDA has CUDA kernels to port. The report names the "
    "call.",
    before='trainer = L.Trainer(accelerator="gpu", devices=4)',
    after="# TODO(tpu-agent TPU109): train with plain PyTorch on DEVICE (DDP/FSDP2, one process per chip)",
    references=(LIGHTNING_ACCELERATORS, ACCELERATE_DISCOVERY, FSDP2, TORCH_TPU),
    apis=(
        ApiEquivalent('Trainer(accelerator="gpu"), Fabric(accelerator="cuda")', "none in Lightning: plain PyTorch"),
        ApiEquivalent('device_map={"h.0": "cuda:0", "h.1": "cuda:1"}', "FSDP2 over one device per process"),
    ),
)

_LIGHTNING = frozenset({"lightning", "pytorch_lightning", "lightning_fabric"})
_GPU_NAMES = frozenset({"cuda", "gpu"})


def _lightning(ctx: PyContext, call: cst.Call) -> bool:
    qualname = ctx.qualname(call)
    return qualname is not None and qualname.partition(".")[0] in _LIGHTNING


@devices.FAMILY.leave(cst.Call)
def library_device_arguments(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    if type(updated) is not cst.Call:
        return updated
    accelerator = keyword(original, "accelerator")
    if accelerator is not None and string_value(accelerator.value) in _GPU_NAMES and _lightning(ctx, original):
        ctx.report(
            "TPU109",
            accelerator.value,
            f"Lightning {arg_source(accelerator)}: Lightning has no TorchTPU accelerator ('tpu' is torch_xla's, 'auto' "
            "would pick the CPU); train with plain PyTorch on the device (DDP or FSDP2, one process per chip)",
        )
    kinds = keyword(original, "device_types")
    if kinds is not None and _gpu_names(kinds.value) and (ctx.qualname(original) or "").startswith("torch.library."):
        ctx.report(
            "TPU109",
            kinds.value,
            f"custom op with {arg_source(kinds)}: its kernel is CUDA's; port it (a Pallas kernel, or PyTorch ops) and "
            "register it for the device in use",
        )
    memory = keyword(original, "max_memory")
    if memory is not None and isinstance(memory.value, cst.Dict):
        cuda_keys = [
            e for e in memory.value.elements if isinstance(e, cst.DictElement) and cuda_device_code(ctx, e.key)
        ]
        if cuda_keys:
            ctx.report("TPU109", memory.value, f"max_memory budgets CUDA devices ({source(cuda_keys[0].key)}, ...)")
    device_map = keyword(original, "device_map")
    if device_map is None:
        return updated
    current = updated.args[updated_index(original, updated, device_map)].value
    if isinstance(device_map.value, cst.Dict) and isinstance(current, cst.Dict):
        new: cst.BaseExpression | None = device_map_entries(ctx, device_map.value, current)
    else:
        new = rewrite_device(ctx, device_map.value, "value", updated=current)
    return replace_original_arg(original, updated, device_map, new) if new is not None else updated


def device_map_entries(ctx: PyContext, original: cst.Dict, updated: cst.Dict) -> cst.Dict | None:
    """A device map's CUDA devices as the device in use when they name one device (``{"": "cuda:0"}``), else
    None: a map over several CUDA devices (or CUDA indices beside named devices) is reported (TPU109)."""
    entries = [e for e in original.elements if isinstance(e, cst.DictElement)]
    cuda = {string_value(e.value) or "" for e in entries if cuda_device_code(ctx, e.value) == "TPU101"}
    if not cuda:
        return None
    indices = {e.value.value for e in entries if isinstance(e.value, cst.Integer)}
    if len(cuda) > 1 or (indices and indices != {"0"}) or (indices and cuda != {"cuda:0"}):
        ctx.report(
            "TPU109",
            original,
            f"device map over several CUDA devices ({', '.join(sorted(cuda | indices))}): TorchTPU runs one device per "
            "process; keep one device or shard with FSDP2",
        )
        return None
    elements = list(updated.elements)
    changed = False
    for i, element in enumerate(original.elements):
        target = elements[i]
        if not isinstance(element, cst.DictElement) or not isinstance(target, cst.DictElement):
            continue
        if string_value(element.value) in cuda:
            new = rewrite_device(ctx, element.value, "value", updated=target.value)
        elif isinstance(element.value, cst.Integer):  # accelerate reads an index as a CUDA device: the same one
            new = ctx.fix("TPU101", element.value, ctx.device_value, lambda n: f"device map index 0 -> {source(n)}")
        else:
            continue
        if new is not None:
            elements[i] = target.with_changes(value=new)
            changed = True
    return updated.with_changes(elements=elements) if changed else None


@devices.FAMILY.leave(cst.Assign)
def device_map_variable(ctx: PyContext, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
    """``device_map = {"transformer.wte": "cuda:0", ...}`` (transformers' tests), passed on by name."""
    if (
        len(original.targets) != 1
        or not isinstance(original.value, cst.Dict)
        or not isinstance(updated.value, cst.Dict)
    ):
        return updated
    if not _name_ends(original.targets[0].target, "device_map"):
        return updated
    new = device_map_entries(ctx, original.value, updated.value)
    return updated.with_changes(value=new) if new is not None else updated


# ---- Lightning's accelerator names and maps of names to CUDA devices --------------------------------------
def _imports_lightning(ctx: PyContext) -> bool:
    return any(name.partition(".")[0] in _LIGHTNING for name in ctx.aliases.values())


def _name_ends(node: cst.CSTNode, suffix: str = "accelerator") -> bool:
    """A name or attribute whose name ends with ``suffix`` (any case)."""
    name = node.value if isinstance(node, cst.Name) else node.attr.value if isinstance(node, cst.Attribute) else ""
    return name.lower().endswith(suffix)


def _gpu_names(node: cst.CSTNode) -> list[str]:
    """The "cuda"/"gpu" strings of a string or a tuple, list or set literal."""
    values = [e.value for e in node.elements] if isinstance(node, (cst.Tuple, cst.List, cst.Set)) else [node]
    return [text for text in (string_value(v) for v in values) if text in _GPU_NAMES]


@devices.FAMILY.leave(cst.Assign)
def lightning_accelerator_name(ctx: PyContext, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
    """``accelerator = "cuda"``, ``allowed_accelerators = {"cpu", "gpu", "cuda"}`` in a module built on Lightning
    (litgpt's api): the names Lightning's Trainer/Fabric take, which have no TorchTPU accelerator."""
    target = original.targets[0].target if len(original.targets) == 1 else None
    if target is None or not _gpu_names(original.value) or not _imports_lightning(ctx):
        return updated
    if _name_ends(target) or _name_ends(target, "accelerators"):
        ctx.report("TPU109", original.value, f"Lightning accelerator name {source(original.value)}: " + _NO_ACCELERATOR)
    return updated


@devices.FAMILY.leave(cst.Comparison)
def lightning_accelerator_test(ctx: PyContext, original: cst.Comparison, updated: cst.Comparison) -> cst.Comparison:
    """``accelerator == "cuda"``, ``accelerator not in ("cuda", "gpu")`` in a module built on Lightning."""
    if len(original.comparisons) != 1:
        return updated
    left, right = original.left, original.comparisons[0].comparator
    named = (_name_ends(left) and _gpu_names(right)) or (_name_ends(right) and _gpu_names(left))
    if named and _imports_lightning(ctx):
        ctx.report("TPU109", original, f"Lightning accelerator test {source(original)}: " + _NO_ACCELERATOR)
    return updated


_NO_ACCELERATOR = "Lightning has no TorchTPU accelerator; decide what this path does on TPU (plain PyTorch on DEVICE)"


@devices.FAMILY.visit(cst.Call)
def _claim_device_map_argument(ctx: PyContext, node: cst.Call) -> None:
    device_map = keyword(node, "device_map")
    if device_map is not None:
        ctx.claim(device_map.value)  # library_device_arguments rewrites or reports it


@devices.FAMILY.visit(cst.Assign)
def _claim_device_map_variable(ctx: PyContext, node: cst.Assign) -> None:
    if len(node.targets) == 1 and _name_ends(node.targets[0].target, "device_map"):
        ctx.claim(node.value)  # device_map_variable rewrites or reports it


@devices.FAMILY.leave(cst.Dict)
def placement_map(ctx: PyContext, original: cst.Dict, updated: cst.Dict) -> cst.Dict:
    """A map from module or parameter names to CUDA devices outside a device_map (a test's expected placement,
    litgpt's ``assert actual == {"lm_head.weight": "cuda:0", ...}``): placements per CUDA device, which TorchTPU's
    one device per process does not reproduce; reported once per map."""
    if ctx.is_claimed(original):
        return updated
    devices_named = [
        string_value(e.value) or ""
        for e in original.elements
        if isinstance(e, cst.DictElement) and string_value(e.key) is not None and cuda_device_code(ctx, e.value)
    ]
    if len(devices_named) >= 2:
        shown = ", ".join(sorted(set(devices_named)))
        ctx.report(
            "TPU109",
            original,
            f"a map of {len(devices_named)} names to CUDA devices ({shown}): TorchTPU runs one device per process "
            "(every rank's is tpu:0); decide what the placements become",
        )
    return updated
