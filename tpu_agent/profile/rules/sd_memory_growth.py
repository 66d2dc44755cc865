"""SD-8: device memory that grows with every step (a tensor kept per step, with its autograd graph)."""

from __future__ import annotations

import ast

from tpu_agent.profile import patches, sources
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, RankProfile, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule, Insufficient, window_steps
from tpu_agent.runtime import events as ev

MIN_GROWTH_BYTES = 64 * 1024  # per step: below this, allocator noise
MIN_STEPS = 3  # a trend needs three peaks


def _kept_per_step(site: ev.Site) -> tuple[int, str] | None:
    """In the loop around the step's line, a ``history.append(loss)`` of a plain name into a list made before the
    loop: each step's tensor (and the graph it holds) stays alive. Returns its line and the name appended."""
    tree = sources.parse_source(site.file)
    if tree is None:
        return None
    loops = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.For, ast.While)) and n.lineno < site.line <= (n.end_lineno or n.lineno)
    ]
    if not loops:
        return None
    loop = max(loops, key=lambda n: n.lineno)
    for node in ast.walk(loop):
        if not isinstance(node, ast.Expr) or node.lineno != node.end_lineno:
            continue
        call = node.value
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "append"
            and isinstance(call.func.value, ast.Name)
            and len(call.args) == 1
            and isinstance(call.args[0], ast.Name)
        ):
            return node.lineno, call.args[0].id
    return None


def _resident_per_step(rank: RankProfile) -> dict[int, int]:
    """Bytes still allocated at each window step's end (the runtime's per-step memory sample): what the step left
    behind. Peaks are not used: a batch that grows (SH-1's case) raises the peak with no leak and frees it all."""
    window = set(window_steps(rank))
    return {
        e.step: e.allocated_bytes
        for e in rank.events
        if isinstance(e, ev.MemorySample) and e.step is not None and e.step in window
    }


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    if not rank.has_memory_trace:
        raise Insufficient("no device memory samples per step")
    resident = _resident_per_step(rank)
    steps = sorted(resident)
    if len(steps) < MIN_STEPS:
        return []
    peaks = [resident[i] for i in steps]
    growth = (peaks[-1] - peaks[0]) / (len(peaks) - 1)
    if growth < MIN_GROWTH_BYTES or any(b < a for a, b in zip(peaks, peaks[1:], strict=False)):
        return []
    locations: list[Location] = []
    change = AgentChange(
        "Find what the loop keeps from every step (a list of losses or outputs, a running total built from "
        "tensors that require grad) and keep a detached value (`.detach()`) or a number read every N steps."
    )
    kept = _kept_per_step(rank.step_site) if rank.step_site else None
    if rank.step_site is not None and kept is not None:
        line, name = kept
        locations.append(Location(rank.step_site.file, line, sources.function_at(rank.step_site.file, line)))
        diff = patches.replace_on_line(rank.step_site.file, line, rf"\.append\({name}\)", f".append({name}.detach())")
        change = AgentChange(
            f"`{name}` is appended every step with its autograd graph (and the activations it saved): append "
            f"`{name}.detach()` instead, which keeps the value and frees the graph.",
            diff,
        )
    if rank.step_site is not None:
        locations.append(Location.from_site(rank.step_site))
    hbm = model.config.chip.hbm_bytes_per_device
    steps_to_full = (hbm - peaks[-1]) / growth  # growth >= MIN_GROWTH_BYTES here
    return [
        RULE.finding(
            f"Device memory left allocated grows {growth / 2**20:.2f} MiB per step ({peaks[0] / 2**20:.1f} -> "
            f"{peaks[-1] / 2**20:.1f} MiB over {len(peaks)} steps): out of HBM after ~{steps_to_full:,.0f} more steps",
            Evidence("bytes of growth per step", round(growth), MIN_GROWTH_BYTES, "bytes", tuple(steps)),
            locations,
            "Memory that grows every step ends in an out-of-memory error on the TPU, after as many steps as HBM "
            "allows. The usual cause is a tensor kept per step that still holds its autograd graph.",
            severity=Severity.error if steps_to_full < 10_000 else Severity.warning,
            agent_change=change,
            saving_pct=0.0,
            confidence=0.7,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="SD-8",
    name="memory grows across steps",
    category="sharding",
    severity=Severity.warning,
    rationale="A tensor kept from every step keeps its graph and saved activations alive: HBM fills, then OOM.",
    before="losses.append(loss)  # every step's graph stays alive",
    after="losses.append(loss.detach())",
    references=("https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory",),
    requires=(STEPS, HOOKS),
    check=_check,
)
