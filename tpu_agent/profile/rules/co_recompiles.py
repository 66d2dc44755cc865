"""CO-1: recompilation churn after warm-up, with the guard that failed (what changed)."""

from __future__ import annotations

from collections import Counter

from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule, by_site, window_steps
from tpu_agent.runtime import events as ev

PER_STEP_ERROR = 0.5


def _advice(reason: str) -> str:
    if "size mismatch" in reason or "stride mismatch" in reason:
        return "An input shape changes between calls: pad or bucket it to a few fixed sizes, or use drop_last=True."
    if "___stack" in reason or "== " in reason or "id(" in reason:
        return "A Python value the graph depends on changes: pass it as a tensor or hoist it out of the compiled region."
    return "Keep the compiled function's inputs (shapes, dtypes, Python constants) the same every call."


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    steps = window_steps(rank)
    first = min(steps, default=0)
    recompiles = [e for e in rank.events if isinstance(e, ev.Compile) and e.is_recompile and (e.step is None or e.step >= first)]
    if not recompiles:
        return []
    per_step = len(recompiles) / max(len(steps), 1)
    reasons = Counter(e.reason for e in recompiles)
    top_reason = reasons.most_common(1)[0][0]
    sites = by_site(recompiles)
    functions = sorted({e.function for e in recompiles})
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
            [Location.from_site(site) for site in list(sites)[:3]],
            _advice(top_reason) + " Each recompile costs seconds to minutes on a TPU.",
            severity=Severity.error if per_step >= PER_STEP_ERROR else Severity.warning,
            agent_change=AgentChange(_advice(top_reason)),
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
    before="loader = DataLoader(ds, batch_size=32)",
    after="loader = DataLoader(ds, batch_size=32, drop_last=True)",
    reference="docs/tpu-performance.md#compilation; https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
    requires=(STEPS, HOOKS),
    check=_check,
)
