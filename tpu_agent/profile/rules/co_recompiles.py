"""CO-1: recompilation churn after warm-up, with the guard that failed (what changed)."""

from __future__ import annotations

from collections import Counter

from tpu_agent.profile import sources
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule, by_site, window_steps
from tpu_agent.runtime import events as ev

PER_STEP_ERROR = 0.5


def _advice(reason: str) -> str:
    if "size mismatch" in reason or "stride mismatch" in reason:
        return "An input shape changes between calls: pad or bucket it to a few fixed sizes, or use drop_last=True."
    if "___stack" in reason or "== " in reason or "id(" in reason:
        return (
            "A Python value the graph depends on changes: pass it as a tensor or hoist it out of the compiled region."
        )
    return "Keep the compiled function's inputs (shapes, dtypes, Python constants) the same every call."


def _shape_change(recompiles: list[ev.Compile]) -> tuple[list[Location], AgentChange | None]:
    """Where the tensor whose shape broke the guard is created, and the edit that pads it to a bucket.

    The guard names the compiled function's argument and dimension; the first call that passes it is
    followed back to the assignment that creates the tensor (:mod:`tpu_agent.profile.sources`).
    """
    for event in recompiles:
        guard = sources.parse_guard(event.reason)
        if guard is None or event.site is None:
            continue
        origin = sources.origin_of_argument(event.site.file, event.function, guard.argument)
        if origin is None:
            continue
        sizes = sorted(
            {
                size
                for e in recompiles
                if (g := sources.parse_guard(e.reason)) and g.argument == guard.argument
                for size in g.sizes
            }
        )
        created = Location(event.site.file, origin.line, sources.function_at(event.site.file, origin.line))
        what = f"`{origin.variable}`" if origin.variable else f"the {guard.argument!r} argument"
        diff = sources.padding_diff(event.site.file, origin, guard.dim, sizes)
        change = AgentChange(
            f"{what} (created at line {origin.line}) takes sizes {', '.join(map(str, sizes[:8]))} in dim {guard.dim}: "
            "pad that dim "
            f"to a multiple of {sources.bucket_for(sizes)} right after it is created (and mask the padding in the "
            "loss), or "
            "bucket the data to a few fixed sizes, so the compiled function sees one shape.",
            diff,
        )
        return [created], change
    return [], None


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    steps = window_steps(rank)
    first = min(steps, default=0)
    recompiles = [
        e for e in rank.events if isinstance(e, ev.Compile) and e.is_recompile and (e.step is None or e.step >= first)
    ]
    if not recompiles:
        return []
    per_step = len(recompiles) / max(len(steps), 1)
    reasons = Counter(e.reason for e in recompiles)
    top_reason = reasons.most_common(1)[0][0]
    sites = by_site(recompiles)
    functions = sorted({e.function for e in recompiles})
    created, padding = _shape_change(recompiles)
    locations = created + [Location.from_site(site) for site in list(sites)[:3]]
    return [
        RULE.finding(
            f"{len(recompiles)} recompilation(s) of {', '.join(functions)} after warm-up: {top_reason}",
            Evidence(
                "recompiles per step",
                round(per_step, 2),
                PER_STEP_ERROR,
                "per step",
                tuple(sorted({e.step for e in recompiles if e.step is not None})),
            ),
            locations,
            _advice(top_reason)
            + (f" The changing tensor is created at line {created[0].line}." if created else "")
            + " Each recompile costs seconds to minutes on a TPU.",
            severity=Severity.error if per_step >= PER_STEP_ERROR else Severity.warning,
            agent_change=padding or AgentChange(_advice(top_reason)),
            saving_pct=min(per_step * 100, 90.0),
            confidence=0.8,
            time_ns=recompiles[0].time_ns,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    id="CO-1",
    name="recompilation churn",
    category="compile",
    severity=Severity.error,
    rationale="TorchTPU compiles static shapes; a guard failure every step means a full XLA compile every step.",
    before="batch = torch.randn(16 + 8 * step, 256, device=device)\nloss = compiled_step(batch)",
    after="batch = torch.randn(16 + 8 * step, 256, device=device)\n"
    "batch = torch.nn.functional.pad(batch, (0, 0, 0, -batch.shape[0] % 128))  # one shape; mask the padding\n"
    "loss = compiled_step(batch)",
    reference="docs/tpu-performance.md#compilation; "
    "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
    requires=(STEPS, HOOKS),
    check=_check,
)
