"""SD-3: the TPU compiler's verdict that the step does not fit one chip's HBM, with the fixes it compiled.

SD-1 adds up what the capture measured on the host; this rule reads what libtpu itself allocated for the
compiled step (parameters, optimizer state, activations, scratch and code, per chip of the target slice),
or its outright refusal (``RESOURCE_EXHAUSTED``). The fixes offered are the ones `tpu-agent estimate`
compiled and saw fit, never a guess.
"""

from __future__ import annotations

import math

from tpu_agent.chips import parse_target
from tpu_agent.profile.compiled import CompiledStep, CompiledSuggestion
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, RankProfile, Severity
from tpu_agent.profile.rules._base import COMPILED, DiagnosticRule
from tpu_agent.profile.rules.sd_memory_fit import fsdp_plan, gib

BF16_CHANGE = (
    "Keep parameters and optimizer state in bf16: `model.to(torch.bfloat16)` before the optimizer is built "
    "(or an optimizer with bf16 state), and compute the loss in fp32."
)


def _checked_fixes(compiled: CompiledStep) -> str:
    return "; ".join(
        f"{s.change} ({s.target}): {'fits' if s.fits else 'does not fit'}, {gib(s.peak_hbm_bytes)} per chip"
        for s in compiled.suggestions
    )


def _change(fix: CompiledSuggestion | None, world: int) -> AgentChange:
    """The code change for the first fix that compiled into a fitting step (FSDP2 over its chips, or bf16)."""
    if fix is None:
        return AgentChange(
            "Shard parameters, gradients and optimizer state with FSDP2 over a larger slice, checkpoint activations "
            "or lower the per-chip batch, then check with `tpu-agent estimate --chip <slice> --strategy fsdp`."
        )
    if "bf16" in fix.change:
        return AgentChange(BF16_CHANGE)
    chips = parse_target(fix.target).chips
    return AgentChange(
        f"{fix.change} (compiled for {fix.target}: fits, {gib(fix.peak_hbm_bytes)} per chip); launch "
        f"{chips} ranks (`tpu-agent run --nproc {chips}` on one host):\n" + fsdp_plan(chips, max(world, chips))
    )


def _largest_weight_site(rank: RankProfile) -> Location | None:
    weights = [w for w in rank.weights if w.site is not None]
    if not weights:
        return None
    largest = max(weights, key=lambda w: math.prod(w.shape))
    return Location.from_site(largest.site) if largest.site else None


def _check(model: ProfileModel) -> list[Finding]:
    compiled = model.compiled
    assert compiled is not None  # guaranteed by requires=(COMPILED,)
    if compiled.fits:
        return []
    rank = model.primary
    chip = compiled.chip
    hbm = compiled.hbm_bytes_per_chip
    need = compiled.peak_hbm_bytes
    worst = max(compiled.programs, key=lambda program: program.hbm_bytes, default=None)
    refused = next((program for program in compiled.programs if program.refused), None)
    fits = next((s for s in compiled.suggestions if s.fits), None)
    locations = [Location.from_site(rank.forward_site)] if rank.forward_site else []
    largest = _largest_weight_site(rank)
    if largest is not None and largest not in locations:
        locations.append(largest)
    checked = _checked_fixes(compiled)
    title = (
        f"The TPU compiler refused the step for {compiled.target}: it needs {gib(need)} of HBM per chip, "
        f"{chip.device_name} has {gib(hbm)}"
        if refused
        else f"The TPU compiler puts the step at {gib(need)} of HBM per chip on {compiled.target}; "
        f"{chip.device_name} has {gib(hbm)}"
    )
    return [
        RULE.finding(
            title,
            Evidence("HBM per chip needed / available (TPU compiler)", round(need / hbm, 4), 1.0, "fraction"),
            locations,
            (f"Program {worst.name!r} needs the most. " if worst else "")
            + (f"Checked by compiling: {checked}. " if checked else "")
            + f"Full breakdown: `tpu-agent estimate --chip {compiled.target} SCRIPT`.",
            agent_change=_change(fits, model.config.world_size),
            confidence=0.95,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="SD-3",
    name="compiled step beyond HBM",
    category="sharding",
    severity=Severity.error,
    rationale="The TPU compiler allocates every buffer of the compiled step ahead of time; when they exceed one "
    "chip's HBM it refuses the program, and the step cannot run on that slice as written.",
    before="model = DDP(model)  # every chip holds all parameters and optimizer state",
    after='mesh = init_device_mesh("tpu", (8,))\nfor block in model.layers:\n    fully_shard(block, mesh=mesh)\n'
    "fully_shard(model, mesh=mesh)",
    references=(
        "docs/tpu-performance.md#the-compiled-program",
        "docs/estimate-json-schema.md",
        "https://docs.jax.dev/en/latest/aot.html",
    ),
    requires=(COMPILED,),
    check=_check,
)
