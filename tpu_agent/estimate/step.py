"""Compile a step's programs for a TPU target and turn the compiler's answers into a :class:`CompiledEstimate`, with
the changes that would make a step fit checked by compiling them too.

Sharding follows the script (``as-captured``: the placements its DDP / FSDP2 / DTensor code gave each tensor)
or a strategy applied to every input (``data-parallel``: parameters on every chip, batch split;
``fsdp``: parameters and optimizer state split on their first divisible dimension, batch split), so the
compiler sees the same collectives and per-chip shapes the real slice would run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from tpu_agent.chips import TpuTarget
from tpu_agent.errors import TpuAgentError
from tpu_agent.estimate.compiler import (
    HbmExhausted,
    compile_for_target,
    compile_session,
    supported_chip_counts,
    tpu_devices,
)
from tpu_agent.estimate.hlo import DTYPE_BYTES, summarize
from tpu_agent.estimate.model import (
    ArgRole,
    ArgSpec,
    CompiledEstimate,
    HbmBreakdown,
    ProgramEstimate,
    StepProgram,
    Suggestion,
)
from tpu_agent.estimate.options import DEFAULT_EFFORT, EFFORT_MEANING, STRATEGIES
from tpu_agent.runtime.tpu_compiler import compiler_status

MESH_AXIS = "chips"
# libtpu compiles a program on about one core (a 7B step's 22 programs: 1.2 cores busy); two programs at once
# keep two cores busy, and more would multiply the compiler's host memory for little more speed
COMPILE_THREADS = 2
_JAX_DTYPES = {
    "float32": "f32", "bfloat16": "bf16", "float16": "f16", "int64": "s64", "int32": "s32", "uint32": "u32", "bool": "pred",
}  # fmt: skip
_STATE_ROLES = (ArgRole.PARAMETER, ArgRole.OPTIMIZER_STATE, ArgRole.GRADIENT)


def _element_bytes(dtype: str) -> float:
    return DTYPE_BYTES.get(_JAX_DTYPES.get(dtype, dtype), 4)


def placement(arg: ArgSpec, strategy: str, chips: int) -> int | None:
    """The dimension of ``arg`` split across ``chips`` under ``strategy`` (``None``: every chip holds all of it).

    A dimension is only split when the chip count divides it; otherwise the tensor stays whole on every chip
    (the memory figure then shows the cost of that choice instead of hiding it).
    """
    if chips == 1:
        return None
    if strategy == "as-captured":
        wanted: list[int] = [] if arg.shard_dim is None else [arg.shard_dim]
    elif arg.role is ArgRole.BATCH:
        wanted = [0]
    elif strategy == "fsdp" and arg.role in _STATE_ROLES:
        wanted = list(range(len(arg.shape)))
    else:
        wanted = []
    return next((dim for dim in wanted if dim < len(arg.shape) and arg.shape[dim] % chips == 0), None)


def per_chip_bytes(arg: ArgSpec, dim: int | None, chips: int) -> int:
    elements = math.prod(arg.shape) // (chips if dim is not None else 1)
    return int(elements * _element_bytes(arg.dtype))


def _abstract_args(program: StepProgram, target: TpuTarget, strategy: str) -> tuple[list[object], list[int | None]]:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(tpu_devices(target)), (MESH_AXIS,))
    abstract, dims = [], []
    for arg in program.args:
        dim = placement(arg, strategy, target.chips)
        spec = PartitionSpec() if dim is None else PartitionSpec(*([None] * dim), MESH_AXIS)
        abstract.append(jax.ShapeDtypeStruct(arg.shape, arg.dtype, sharding=NamedSharding(mesh, spec)))
        dims.append(dim)
    return abstract, dims


_COMPILED: dict[tuple[object, ...], ProgramEstimate] = {}


def compile_program(
    program: StepProgram, target: TpuTarget, strategy: str = "as-captured", effort: str = DEFAULT_EFFORT
) -> ProgramEstimate:
    """Compile one program for ``target`` and attribute the HBM it needs per chip to parameters, optimizer
    state, inputs, outputs, temporaries and code. A program compiled once for a target is not compiled again
    in this process (suggestions revisit the same configurations)."""
    key = (program.name, id(program.fn), program.args, program.donated, program.calls, target.spec, strategy, effort)
    if key not in _COMPILED:
        _COMPILED[key] = _compile_program(program, target, strategy, effort)
    return _COMPILED[key]


def _compile_program(program: StepProgram, target: TpuTarget, strategy: str, effort: str) -> ProgramEstimate:
    if strategy not in STRATEGIES:
        raise TpuAgentError(
            "bad-strategy", f"unknown sharding strategy {strategy!r}", f"use one of: {', '.join(STRATEGIES)}"
        )
    abstract, dims = _abstract_args(program, target, strategy)
    by_role = {role: 0 for role in ArgRole}
    for arg, dim in zip(program.args, dims, strict=True):
        by_role[arg.role] += per_chip_bytes(arg, dim, target.chips)
    inputs = sum(by_role.values())
    from tpu_agent.runtime.xla import tpu_kernels

    try:
        with tpu_kernels.as_on_tpu() as kernels:
            artifacts = compile_for_target(program.fn, abstract, target, donate_argnums=program.donated, effort=effort)
    except HbmExhausted as refusal:
        # The compiler stops before its cost analysis; what it needs beyond the inputs is temporaries.
        memory = HbmBreakdown(
            parameters=by_role[ArgRole.PARAMETER],
            optimizer_state=by_role[ArgRole.OPTIMIZER_STATE],
            batch_and_other_inputs=by_role[ArgRole.BATCH] + by_role[ArgRole.OTHER],
            gradients=by_role[ArgRole.GRADIENT],
            outputs=0,
            temporaries=max(0, refusal.required_bytes - inputs),
            code=0,
        )
        return ProgramEstimate(
            program.name,
            0.0,
            0.0,
            0.0,
            0.0,
            memory,
            summarize(""),
            inputs,
            refusal.message,
            program.calls,
            kernels=sorted(kernels.kernels),
        )
    memory = HbmBreakdown(
        parameters=by_role[ArgRole.PARAMETER],
        optimizer_state=by_role[ArgRole.OPTIMIZER_STATE],
        batch_and_other_inputs=by_role[ArgRole.BATCH] + by_role[ArgRole.OTHER],
        gradients=by_role[ArgRole.GRADIENT],
        outputs=max(0, artifacts.memory["output"] - artifacts.memory["alias"]),
        temporaries=artifacts.memory["temp"],
        code=artifacts.memory["code"],
    )
    # the kernels' tiles beyond the first, which the compiler counted once; their work is split as the batch is
    batch_split = any(dim is not None for arg, dim in zip(program.args, dims, strict=True) if arg.role is ArgRole.BATCH)
    uncounted = kernels.uncounted_flops / (target.chips if batch_split else 1)
    flops = max(0.0, artifacts.cost.get("flops", 0.0)) + uncounted
    bytes_accessed = max(0.0, artifacts.cost.get("bytes accessed", 0.0))
    seconds, timed_by = program_seconds(artifacts.cost.get("optimal_seconds", -1.0), flops, bytes_accessed, target)
    if timed_by == "compiler":
        seconds += uncounted / target.chip.peak_bf16_flops_per_device
    return ProgramEstimate(
        name=program.name,
        flops=flops,
        bytes_accessed=bytes_accessed,
        transcendentals=max(0.0, artifacts.cost.get("transcendentals", 0.0)),
        optimal_seconds=seconds,
        memory=memory,
        hlo=summarize(artifacts.hlo_text),
        compiler_argument_bytes=artifacts.memory["argument"],
        calls=program.calls,
        timed_by=timed_by,
        kernels=sorted(kernels.kernels),
    )


_RESIDENT_ROLES = (ArgRole.PARAMETER, ArgRole.OPTIMIZER_STATE)


def with_resident_state(
    programs: Sequence[StepProgram], compiled: Sequence[ProgramEstimate], target: TpuTarget, strategy: str
) -> list[ProgramEstimate]:
    """Each program's HBM with the parameters and optimizer state that stay on the chip while it runs but that
    only other programs read. A step cut into programs (FSDP2 gathers a layer per program, the optimizer runs
    apart) has each program read a share of the state; the compiler counts only its inputs, and the largest
    program alone understated the step's need by the rest of the model (a step that does not fit read "fits")."""
    resident: dict[int, tuple[ArgRole, int]] = {}
    for program in programs:
        read: dict[int, tuple[ArgRole, int]] = {}  # a storage read through several views is all of them
        for arg in program.args:
            if arg.storage is not None and arg.role in _RESIDENT_ROLES:
                size = per_chip_bytes(arg, placement(arg, strategy, target.chips), target.chips)
                read[arg.storage] = (arg.role, read.get(arg.storage, (arg.role, 0))[1] + size)
        for storage, (role, size) in read.items():
            if size > resident.get(storage, (role, 0))[1]:
                resident[storage] = (role, size)
    if not resident:
        return list(compiled)
    held = []
    for program, estimate in zip(programs, compiled, strict=True):
        own = {arg.storage for arg in program.args}
        elsewhere = {role: 0 for role in _RESIDENT_ROLES}
        for storage, (role, size) in resident.items():
            if storage not in own:
                elsewhere[role] += size
        memory = replace(
            estimate.memory,
            parameters=estimate.memory.parameters + elsewhere[ArgRole.PARAMETER],
            optimizer_state=estimate.memory.optimizer_state + elsewhere[ArgRole.OPTIMIZER_STATE],
        )
        held.append(replace(estimate, memory=memory))
    return held


def program_seconds(
    optimal_seconds: float, flops: float, bytes_accessed: float, target: TpuTarget
) -> tuple[float, str]:
    """The program's time on one chip and where it comes from: the compiler's ``optimal_seconds``, or, where
    libtpu has no figure for a program (it answers -1: seen on a 7B Llama step; or leaves the key out, as for
    a one-chip program with loops), the roofline of the compiler's
    own FLOPs and bytes, so one unknown program cannot turn the step time negative."""
    if optimal_seconds >= 0:
        return optimal_seconds, "compiler"
    chip = target.chip
    return max(flops / chip.peak_bf16_flops_per_device, bytes_accessed / chip.hbm_bandwidth_per_device), "roofline"


def _compile_all(
    programs: Sequence[StepProgram], target: TpuTarget, strategy: str, effort: str
) -> list[ProgramEstimate]:
    """Every program compiled, :data:`COMPILE_THREADS` at a time, in the order :func:`compile_order` gives;
    the results in the programs' order."""
    with compile_session(), ThreadPoolExecutor(COMPILE_THREADS) as pool:
        futures = {
            id(program): pool.submit(compile_program, program, target, strategy, effort)
            for program in compile_order(programs)
        }
        return [futures[id(program)].result() for program in programs]


def compile_order(programs: Sequence[StepProgram]) -> list[StepProgram]:
    """Largest programs (by ops) first, but the largest second.

    Lowering (tracing to JAX) is one at a time, compiling two at a time. A large program started last leaves
    the other thread idle while it alone lowers and compiles (a 7B step's optimizer update, traced from a loop
    per parameter, is the largest and slowest of all); started first, its long lowering keeps the other thread
    waiting with nothing lowered yet. Second, it lowers while the first program compiles."""
    largest_first = sorted(programs, key=lambda program: -program.ops)
    return largest_first[1:2] + largest_first[:1] + largest_first[2:]


def estimate_step(
    programs: Sequence[StepProgram],
    target: TpuTarget,
    strategy: str = "as-captured",
    model_flops_per_step: float | None = None,
    effort: str = DEFAULT_EFFORT,
) -> CompiledEstimate:
    """Compile every program of the step for ``target`` at ``effort`` and gather the result into one
    :class:`CompiledEstimate`."""
    if target.chips not in supported_chip_counts(target.chip.key):
        raise TpuAgentError(
            "unsupported-target",
            f"--chip {target.spec}: no {target.chip.key} slice of {target.chips} chips is known to the compiler",
            f"use a {target.chip.key} slice of {', '.join(map(str, supported_chip_counts(target.chip.key)))} chips",
        )
    compiled = _compile_all(programs, target, strategy, effort)
    compiled = with_resident_state(programs, compiled, target, strategy)
    status = compiler_status()
    rooflined = [program.name for program in compiled if program.timed_by == "roofline"]
    estimate = CompiledEstimate(
        target=target.spec,
        chip_name=target.chip.device_name,
        chips=target.chips,
        strategy=strategy,
        effort=effort,
        hbm_bytes_per_chip=target.chip.hbm_bytes_per_device,
        peak_bf16_flops_per_chip=target.chip.peak_bf16_flops_per_device,
        programs=compiled,
        model_flops_per_step=model_flops_per_step,
        compiler=status.reason,
        assumptions=[
            f"compiled by libtpu for {target.chips} x {target.chip.device_name} ({strategy} sharding) at {effort} "
            f"effort ({EFFORT_MEANING[effort]}); nothing ran",
            "memory: per chip, from the compiler's memory analysis; programs of one step run one after another, so "
            "the step needs the largest of them",
            "time: the compiler's optimal_seconds summed over programs (ideal overlap, no host or input pipeline time)",
            "MFU: model FLOPs over that time and the chips' peak bf16 FLOP/s",
        ],
    )
    if len(compiled) > 1:
        estimate.assumptions.append(
            "parameters and optimizer state count in every program, read there or not (they stay on the chip); "
            "other tensors the step keeps between its programs count only in the programs that read them, so the "
            "peak program's figure leaves out activations the others keep (under activation checkpointing, the "
            "saved inputs of the other layers)"
        )
    kernels = sorted({kernel for program in compiled for kernel in program.kernels})
    if kernels:
        estimate.assumptions.append(
            "lowered as TorchTPU runs it on a TPU, not as the CPU does: " + "; ".join(kernels) + " (FLOPs of the "
            "math form, causal masks included: a kernel that skips fully masked tiles does about half of those)"
        )
        estimate.assumptions.append(
            "the compiler counts a kernel's tile loop once; the FLOPs of its other tiles are added to the FLOPs "
            "and, at peak FLOP/s, to the time, split over the chips as the batch is"
        )
    if rooflined:
        estimate.assumptions.append(
            f"the compiler gave no optimal_seconds for {', '.join(rooflined)}: their time is the roofline of the "
            "compiler's FLOPs and bytes (peak bf16 FLOP/s, HBM bandwidth)"
        )
    return estimate


def _bf16_state(program: StepProgram) -> StepProgram:
    return program.with_args(
        [
            arg.with_dtype("bfloat16") if arg.role in _STATE_ROLES and arg.dtype == "float32" else arg
            for arg in program.args
        ]
    )


def suggest_fixes(
    programs: Sequence[StepProgram],
    target: TpuTarget,
    strategy: str,
    max_compiles: int = 6,
    *,
    current: CompiledEstimate | None = None,
    effort: str = DEFAULT_EFFORT,
) -> list[Suggestion]:
    """Changes that make a step that does not fit fit, each verified by compiling it (at most ``max_compiles``
    compilations): FSDP over the same chips, bf16 parameters and optimizer state, and the smallest larger slice
    with FSDP. (A smaller batch changes the captured graph's own shapes, so it is checked by capturing again with
    the script's smaller batch, not here.)"""
    candidates: list[tuple[str, TpuTarget, str, list[StepProgram]]] = []
    if target.chips > 1 and strategy != "fsdp":
        candidates.append(
            (
                f"shard parameters and optimizer state over the {target.chips} chips (FSDP2 fully_shard)",
                target,
                "fsdp",
                list(programs),
            )
        )
    if any(arg.role in _STATE_ROLES and arg.dtype == "float32" for program in programs for arg in program.args):
        candidates.append(
            ("keep parameters and optimizer state in bf16", target, strategy, [_bf16_state(p) for p in programs])
        )
    for count in supported_chip_counts(target.chip.key):
        if count > target.chips:
            bigger = TpuTarget(target.chip, count)
            candidates.append(
                (
                    f"FSDP over a {bigger.spec} slice (the same global batch: {count // target.chips}x smaller "
                    "per chip)",
                    bigger,
                    "fsdp",
                    list(programs),
                )
            )
    suggestions: list[Suggestion] = []
    for change, candidate_target, candidate_strategy, candidate_programs in candidates[:max_compiles]:
        estimate = estimate_step(candidate_programs, candidate_target, candidate_strategy, effort=effort)
        suggestions.append(
            Suggestion(change, candidate_target.spec, estimate.fits, estimate.peak_hbm_bytes, estimate.step_seconds)
        )
        if estimate.fits and candidate_target is not target:
            break  # the smallest larger slice that fits was found; larger ones would fit too
    if current is None:  # the caller's estimate of the step as captured, else compiled (again) here
        current = estimate_step(programs, target, strategy, effort=effort)
    return suggestions + _recapture_suggestions(current, target)


def _recapture_suggestions(current: CompiledEstimate, target: TpuTarget) -> list[Suggestion]:
    """Changes to the step itself, which this capture cannot compile, offered (unverified) when what the step
    keeps between its forward and backward (temporaries) is its largest HBM class in ``current`` (the step as
    captured): checkpointing and a smaller per-chip batch each shrink it; a capture with the change checks it."""
    largest = current.largest_memory
    if not largest or largest[0][0] != "temporaries":
        return []
    return [
        Suggestion(
            f"activation checkpointing (torch.utils.checkpoint, model.gradient_checkpointing_enable()): "
            f"temporaries are {largest[0][1] / 2**30:.1f} GiB per chip; rerun the estimate with it to check",
            target.spec,
            False,
            0,
            0.0,
            verified=False,
        ),
        Suggestion(
            "a smaller per-chip batch (or sequence): rerun the estimate with it to check",
            target.spec,
            False,
            0,
            0.0,
            verified=False,
        ),
    ]
