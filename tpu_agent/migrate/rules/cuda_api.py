"""TPU2xx: ``torch.cuda.*`` calls and classes, mapped to ``torch.accelerator`` / ``torch.Stream`` / ``torch.Event``.

Matching is by qualified name (``import torch.cuda as tc; tc.synchronize()`` and
``from torch.cuda import synchronize`` are both found); a name is rewritten only when torch has a
device-agnostic twin at the version given in ``since_torch``. Everything else under ``torch.cuda`` is
reported, with what to do on TPU, so that no CUDA-only call survives silently.

Each rule record sits next to the handler that applies it. The parts that need none of the family's tables of
CUDA calls live apart: what the rewritten calls need to keep running (CPU guards and values, positional devices,
TPU's device-property fields: :mod:`~tpu_agent.migrate.rules.accelerator_guards`), binding a rank's device
(:mod:`~tpu_agent.migrate.rules.bind_device`) and repeated seeding (:mod:`~tpu_agent.migrate.rules.seeding`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety, Target
from tpu_agent.migrate.rules._base import Family
from tpu_agent.migrate.rules._cst import (
    keep_parens,
    keyword,
    source,
)
from tpu_agent.migrate.rules.references import (
    ACCELERATOR,
    DISTRIBUTED,
    PROFILER,
    RANDOM,
)

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

FAMILY = Family("cuda-api")

_MEMORY = {
    "empty_cache": "empty_cache",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
    "memory_cached": "memory_reserved",
    "max_memory_cached": "max_memory_reserved",
    "reset_max_memory_allocated": "reset_peak_memory_stats",
    "reset_max_memory_cached": "reset_peak_memory_stats",
    "mem_get_info": "get_memory_info",
}

# qualified name -> (rule, replacement under torch.)
RENAMES: dict[str, tuple[str, str]] = {
    "torch.cuda.is_available": ("TPU201", "accelerator.is_available"),
    "torch.cuda.device_count": ("TPU201", "accelerator.device_count"),
    "torch.cuda.current_device": ("TPU201", "accelerator.current_device_index"),
    "torch.cuda.set_device": ("TPU201", "accelerator.set_device_index"),
    "torch.cuda.device": ("TPU201", "accelerator.device_index"),
    "torch.cuda.synchronize": ("TPU202", "accelerator.synchronize"),
    "torch.cuda.current_stream": ("TPU202", "accelerator.current_stream"),
    "torch.cuda.set_stream": ("TPU202", "accelerator.set_stream"),
    "torch.cuda.Stream": ("TPU202", "Stream"),
    "torch.cuda.Event": ("TPU202", "Event"),
    "torch.cuda.manual_seed": ("TPU204", "manual_seed"),
    "torch.cuda.manual_seed_all": ("TPU204", "manual_seed"),
    "torch.cuda.seed": ("TPU204", "seed"),
    "torch.cuda.seed_all": ("TPU204", "seed"),
    "torch.cuda.OutOfMemoryError": ("TPU205", "OutOfMemoryError"),
    "torch.cuda.nvtx.range": ("TPU206", "profiler.record_function"),
    **{f"torch.cuda.{old}": ("TPU203", f"accelerator.{new}") for old, new in _MEMORY.items()},
    **{f"torch.cuda.memory.{old}": ("TPU203", f"accelerator.{new}") for old, new in _MEMORY.items()},
}

# qualified name -> the function of the device's own module (torch.tpu on TPU) that answers it
DEVICE_MODULE: dict[str, str] = {
    "torch.cuda.get_device_name": "get_device_name",
    "torch.cuda.get_device_properties": "get_device_properties",
}

_PROFILE = "use tpu-agent profile (XProf memory view) or torch.tpu._hbm_usage_summary() on TPU"
# qualified name -> (rule, what to do)
MANUAL: dict[str, tuple[str, str]] = {
    "torch.cuda.nvtx.range_push": ("TPU207", "wrap the range in `with torch.profiler.record_function(name):`"),
    "torch.cuda.nvtx.range_pop": ("TPU207", "close the torch.profiler.record_function block that replaces the push"),
    "torch.cuda.nvtx.mark": ("TPU207", "use a short torch.profiler.record_function range"),
    "torch.cuda.get_device_capability": (
        "TPU208",
        "no capability tuple on TPU; gate on an explicit option (bf16 is native on TPU)",
    ),
    "torch.cuda.is_bf16_supported": ("TPU208", "bf16 is always native on TPU; make the check an explicit option"),
    "torch.cuda.get_arch_list": ("TPU208", "CUDA architectures have no TPU meaning; remove the check"),
    "torch.version.cuda": ("TPU208", "guard CUDA-version logic with `if torch.version.cuda:` or remove it"),
    "torch.cuda.memory_summary": ("TPU209", _PROFILE),
    "torch.cuda.memory_snapshot": ("TPU209", _PROFILE),
    "torch.cuda.memory._record_memory_history": ("TPU209", _PROFILE),
    "torch.cuda.memory._dump_snapshot": ("TPU209", _PROFILE),
    "torch.cuda.memory._snapshot": ("TPU209", _PROFILE),
    "torch.cuda._record_memory_history": ("TPU209", _PROFILE),
    "torch.cuda.set_per_process_memory_fraction": (
        "TPU209",
        "no memory fraction on TPU; size the batch to HBM instead",
    ),
    "torch.cuda.list_gpu_processes": ("TPU209", _PROFILE),
    "torch.cuda.ipc_collect": (
        "TPU210",
        "no CUDA IPC on TPU; remove it and share tensors through the host or torch.distributed",
    ),
    "torch.cuda.default_stream": (
        "TPU211",
        "TPU streams are placeholders; drop the stream handling or use torch.accelerator.current_stream()",
    ),
    "torch.cuda.stream": ("TPU211", "use `with s:` on a torch.Stream, or drop the stream: XLA orders TPU work itself"),
    "torch.cuda.get_rng_state": (
        "TPU211",
        "use torch.get_device_module(DEVICE).get_rng_state() (torch.accelerator.random is newer than 2.13)",
    ),
    "torch.cuda.set_rng_state": ("TPU211", "use torch.get_device_module(DEVICE).set_rng_state(state)"),
    "torch.cuda.get_rng_state_all": ("TPU211", "use torch.get_device_module(DEVICE).get_rng_state_all()"),
    "torch.cuda.set_rng_state_all": ("TPU211", "use torch.get_device_module(DEVICE).set_rng_state_all(states)"),
    "torch.cuda.initial_seed": ("TPU211", "use torch.initial_seed()"),
    "torch.cuda.nccl": ("TPU211", "use torch.distributed collectives (tpu_dist backend on TPU)"),
    "torch.cuda.comm": ("TPU211", "use torch.distributed collectives (tpu_dist backend on TPU)"),
}
_LEGACY_TENSORS = (
    "FloatTensor",
    "DoubleTensor",
    "HalfTensor",
    "BFloat16Tensor",
    "LongTensor",
    "IntTensor",
    "ShortTensor",
    "CharTensor",
    "ByteTensor",
    "BoolTensor",
)
for _name in _LEGACY_TENSORS:
    MANUAL[f"torch.cuda.{_name}"] = (
        "TPU211",
        "use torch.empty(..., dtype=..., device=DEVICE) or torch.tensor(..., device=DEVICE)",
    )


# names under torch.cuda that are read or imported, not called (the rest are functions or classes)
_NOT_CALLED = frozenset({"torch.version.cuda", "torch.cuda.nccl", "torch.cuda.comm"})


def _written(qualname: str) -> str:
    """How user code writes the API: ``torch.cuda.synchronize()`` for a function, the bare name otherwise."""
    last = qualname.rpartition(".")[2]
    return qualname if qualname in _NOT_CALLED or last[:1].isupper() else f"{qualname}()"


def _apis(code: str) -> tuple[ApiEquivalent, ...]:
    """The API rows of rule ``code``, read off the tables the handler rewrites and reports from."""
    rows = [
        ApiEquivalent(_written(qualname), _written(f"torch.{path}"))
        for qualname, (rule, path) in RENAMES.items()
        if rule == code and not qualname.startswith("torch.cuda.memory.")
    ]
    if code == "TPU201":
        rows += [
            ApiEquivalent(
                _written(qualname),
                f"torch.get_device_module(DEVICE).{function}() (--target tpu: torch.tpu.{function}())",
            )
            for qualname, function in DEVICE_MODULE.items()
        ]
        rows.append(
            ApiEquivalent(
                "torch.accelerator.set_device_index(rank)",
                'the same, run only where DEVICE.type != "tpu" (--target tpu: deleted)',
            )
        )
    rows += [ApiEquivalent(_written(qualname), advice) for qualname, (rule, advice) in MANUAL.items() if rule == code]
    return tuple(rows)


FAMILY.rule(
    code="TPU201",
    name="cuda-device-api",
    safety=Safety.SAFE,
    summary="torch.cuda device queries: is_available, device_count, current_device, set_device, device(i), "
    "get_device_name, get_device_properties; torch.accelerator.set_device_index(rank) in device-agnostic code.",
    rationale="TorchTPU implements the torch.accelerator API (its own torch.tpu twins raise when called from user "
    "code); torch.accelerator works on CUDA builds too. TorchTPU binds one device per process and rejects "
    "set_device_index with any other index, so set_device is deleted for the tpu target and, for the accelerator "
    "target, still binds the CUDA device of each rank but is skipped on TPU. Code already written against "
    "torch.accelerator gets the same treatment where it binds an index other than 0 (rank, local_rank, args.gpu): "
    "rank 1 would fail on TPU with 'Cannot set TPU device to index 1'. The device name and properties come from "
    "the device's own module (torch.tpu on TPU). For the accelerator target, calls that need a device are guarded "
    "with torch.accelerator.is_available() (statements) or get their CPU value (expressions) so CPU-only runs keep "
    "working.",
    before="torch.cuda.set_device(local_rank)\nn = torch.cuda.device_count()\nname = torch.cuda.get_device_name()",
    after='if torch.accelerator.is_available() and DEVICE.type != "tpu":  # TorchTPU binds one device per process\n'
    "    torch.accelerator.set_device_index(local_rank)\n"
    "n = torch.accelerator.device_count()\n"
    'name = torch.get_device_module(DEVICE).get_device_name() if torch.accelerator.is_available() else "cpu"\n'
    "# --target tpu: the set_device line is deleted; name = torch.tpu.get_device_name()",
    references=(ACCELERATOR,),
    since_torch="2.8",
    apis=_apis("TPU201"),
)
FAMILY.rule(
    code="TPU202",
    name="cuda-sync-stream-event",
    safety=Safety.SAFE,
    summary="torch.cuda synchronisation, streams and events: synchronize, current_stream, set_stream, Stream, Event.",
    rationale="torch.accelerator.synchronize/current_stream/set_stream and the generic torch.Stream/torch.Event are "
    "what TorchTPU implements (streams are placeholders; event times are measured on the host).",
    before="torch.cuda.synchronize()\nstart = torch.cuda.Event(enable_timing=True)",
    after="if torch.accelerator.is_available():\n    torch.accelerator.synchronize()\nstart = "
    "torch.Event(enable_timing=True)",
    references=(ACCELERATOR,),
    since_torch="2.6",
    apis=_apis("TPU202"),
)
FAMILY.rule(
    code="TPU203",
    name="cuda-memory-api",
    safety=Safety.SAFE,
    summary="torch.cuda memory statistics and cache calls: memory_allocated, max_memory_allocated, empty_cache, "
    "mem_get_info...",
    rationale="The same functions live in torch.accelerator (legacy *_cached names map to *_reserved); they work for "
    "any accelerator whose allocator reports statistics.",
    before="peak = torch.cuda.max_memory_allocated()\ntorch.cuda.empty_cache()",
    after="peak = torch.accelerator.max_memory_allocated() if torch.accelerator.is_available() else 0\n"
    "if torch.accelerator.is_available():\n    torch.accelerator.empty_cache()",
    references=(ACCELERATOR,),
    since_torch="2.10",
    apis=_apis("TPU203"),
)
FAMILY.rule(
    code="TPU204",
    name="cuda-manual-seed",
    safety=Safety.SAFE,
    summary="torch.cuda.manual_seed / manual_seed_all / seed / seed_all.",
    rationale="torch.manual_seed seeds the CPU and every accelerator, TPU included. A CUDA seeding call that an "
    "identical torch.manual_seed (same arguments, not rebound in between) has already run before, in the same "
    "function or module, is deleted rather than turned into a second torch.manual_seed (harmless, but noise); an "
    "if left empty by the deletion goes with it.",
    before="torch.cuda.manual_seed_all(0)",
    after="torch.manual_seed(0)",
    references=(RANDOM,),
    apis=_apis("TPU204"),
)
FAMILY.rule(
    code="TPU205",
    name="cuda-oom-error",
    safety=Safety.SAFE,
    summary="torch.cuda.OutOfMemoryError.",
    rationale="torch.OutOfMemoryError is the device-agnostic exception (torch.cuda.OutOfMemoryError is its CUDA "
    "alias).",
    before="except torch.cuda.OutOfMemoryError:",
    after="except torch.OutOfMemoryError:",
    references=(ACCELERATOR,),
    since_torch="2.5",
    apis=_apis("TPU205"),
)
FAMILY.rule(
    code="TPU206",
    name="cuda-nvtx-range",
    safety=Safety.SAFE,
    summary="torch.cuda.nvtx.range(...) context.",
    rationale="NVTX ranges exist only in NVIDIA tools; torch.profiler.record_function ranges appear in XProf traces "
    "on TPU and in every torch profiler trace.",
    before='with torch.cuda.nvtx.range("forward"):',
    after='with torch.profiler.record_function("forward"):',
    references=(PROFILER,),
    apis=_apis("TPU206"),
)
FAMILY.rule(
    code="TPU207",
    name="cuda-nvtx-push-pop",
    safety=Safety.MANUAL,
    summary="torch.cuda.nvtx.range_push / range_pop / mark.",
    rationale="The push/pop pairs need block structure to become a torch.profiler.record_function context; that is a "
    "person's call.",
    before='torch.cuda.nvtx.range_push("step")\n...\ntorch.cuda.nvtx.range_pop()',
    after='with torch.profiler.record_function("step"):\n    ...',
    references=(PROFILER,),
    apis=_apis("TPU207"),
)
FAMILY.rule(
    code="TPU208",
    name="cuda-capability-check",
    safety=Safety.MANUAL,
    summary="GPU capability checks: get_device_capability, is_bf16_supported, get_arch_list, torch.version.cuda, and "
    "CUDA-only device properties (get_device_properties(d).major).",
    rationale="There is no device-agnostic capability query (TorchTPU's compute capability is an empty string); gates "
    "on (major, minor) usually protect bf16/flash/TF32 paths, and bf16 is always native on TPU.",
    before="if torch.cuda.get_device_capability()[0] >= 8:\n    dtype = torch.bfloat16",
    after="# on TPU bf16 is always available: make the gate an explicit option\ndtype = torch.bfloat16",
    references=(ACCELERATOR,),
    apis=_apis("TPU208"),
)
FAMILY.rule(
    code="TPU209",
    name="cuda-memory-introspection",
    safety=Safety.MANUAL,
    summary="CUDA allocator introspection and limits: memory_summary, memory_snapshot, _record_memory_history, "
    "set_per_process_memory_fraction, list_gpu_processes.",
    rationale="No device-agnostic equivalent exists in torch 2.13; on TPU use the XProf memory profile "
    "(tpu-agent profile) and torch.tpu._hbm_usage_summary().",
    before="torch.cuda.memory._record_memory_history()\ntorch.cuda.set_per_process_memory_fraction(0.5)",
    after="# TODO(tpu-agent TPU209): use tpu-agent profile's memory view",
    references=(ACCELERATOR,),
    apis=_apis("TPU209"),
)
FAMILY.rule(
    code="TPU210",
    name="cuda-ipc",
    safety=Safety.MANUAL,
    summary="CUDA inter-process sharing: torch.cuda.ipc_collect, Event(interprocess=True).",
    rationale="TorchTPU has no IPC handles (ipc_handle raises NotImplementedError); share tensors through the host or "
    "torch.distributed instead.",
    before="torch.cuda.ipc_collect()",
    after="# TODO(tpu-agent TPU210): share through the host or torch.distributed",
    references=(DISTRIBUTED,),
    apis=_apis("TPU210"),
)
FAMILY.rule(
    code="TPU211",
    name="cuda-api-no-equivalent",
    safety=Safety.MANUAL,
    summary="Any other torch.cuda reference (default_stream, stream(s), RNG state, legacy tensor types, nccl, "
    "comm...).",
    rationale="These have no device-agnostic twin in torch 2.13; each message says what to use instead.",
    before="state = torch.cuda.get_rng_state()",
    after="state = torch.get_device_module(DEVICE).get_rng_state()",
    references=(ACCELERATOR, RANDOM),
    apis=(
        *_apis("TPU211"),
        ApiEquivalent(
            "any other torch.cuda.* name",
            "torch.get_device_module(DEVICE).<name> where the backend provides it, else remove it",
        ),
    ),
)

FAMILY.rule(
    code="TPU212",
    name="profiler-cuda-activity",
    safety=Safety.MANUAL,
    summary="torch.profiler.ProfilerActivity.CUDA.",
    rationale="There is no device-agnostic profiler activity; TorchTPU traces through ProfilerActivity.PrivateUse1 "
    "with its own profiler config, and tpu-agent profile captures an XProf trace without code changes.",
    before="activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]",
    after="activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]  # or run tpu-agent profile",
    references=(PROFILER,),
    apis=(
        ApiEquivalent(
            "torch.profiler.ProfilerActivity.CUDA",
            "torch.profiler.ProfilerActivity.PrivateUse1 (TorchTPU), or capture with tpu-agent profile",
        ),
    ),
)


def _lookup(table: dict[str, tuple[str, str]], qualname: str) -> tuple[str, str] | None:
    """The entry for ``qualname`` or for its longest dotted prefix (``torch.cuda.nccl.all_reduce``)."""
    name = qualname
    while name:
        if name in table:
            return table[name]
        name = name.rpartition(".")[0]
    return None


@FAMILY.reference("torch.cuda", "torch.version.cuda")
def cuda_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    rename = RENAMES.get(qualname)
    if rename is not None:
        code, path = rename
        new = ctx.fix(code, original, lambda: ctx.torch_attr(path), lambda n: f"{qualname} -> {source(n)}")
        return keep_parens(original, new) if new is not None else updated
    function = DEVICE_MODULE.get(qualname)
    if function is not None:
        new = ctx.fix(
            "TPU201", original, lambda: _device_module_function(ctx, function), lambda n: f"{qualname} -> {source(n)}"
        )
        return keep_parens(original, new) if new is not None else updated
    manual = _lookup(MANUAL, qualname)
    if manual is not None:
        code, advice = manual
        ctx.report(code, original, f"{qualname}: {advice}")
        return updated
    ctx.report(
        "TPU211",
        original,
        f"{qualname} has no device-agnostic equivalent in torch 2.13: remove it, or use "
        "torch.get_device_module(DEVICE) where the backend provides the same function",
    )
    return updated


def _device_module_function(ctx: PyContext, function: str) -> cst.Attribute:
    """``torch.tpu.<function>`` for the tpu target, ``torch.get_device_module(DEVICE).<function>`` otherwise."""
    if ctx.target is Target.TPU:
        return ctx.torch_attr(f"tpu.{function}")  # type: ignore[return-value]
    module = cst.Call(func=ctx.torch_attr("get_device_module"), args=[cst.Arg(ctx.device_value())])
    return cst.Attribute(value=module, attr=cst.Name(function))


@FAMILY.reference("torch.profiler.ProfilerActivity.CUDA", "torch.autograd.profiler.ProfilerActivity.CUDA")
def profiler_activity_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    ctx.report(
        "TPU212",
        original,
        "ProfilerActivity.CUDA: on TPU trace ProfilerActivity.PrivateUse1 (TorchTPU), or capture with tpu-agent profile",
    )
    return updated


@FAMILY.visit(cst.Call)
def _interprocess_event(ctx: PyContext, node: cst.Call) -> None:
    # torch.cuda.Event(interprocess=True) is IPC (TPU210), not a timing event to rename.
    if ctx.qualname(node.func) == "torch.cuda.Event":
        flag = keyword(node, "interprocess")
        if flag is not None and not (isinstance(flag.value, cst.Name) and flag.value.value == "False"):
            ctx.claim(node.func)
            ctx.report("TPU210", node, "torch.cuda.Event(interprocess=True): TorchTPU events have no IPC handles")
