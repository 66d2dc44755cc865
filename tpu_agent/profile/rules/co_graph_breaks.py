"""CO-2: graph breaks under torch.compile, each with Dynamo's reason and the user line."""

from __future__ import annotations

from collections.abc import Sequence

from tpu_agent.profile import patches
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, DiagnosticRule, by_site
from tpu_agent.runtime import events as ev

GENERIC_REASON = "Encountered graph break"
CAPTURE_SCALARS = "torch._dynamo.config.capture_scalar_outputs = True"
NO_DIFF = (
    "moving a statement out of a compiled function changes what the function does and what its callers must do "
    "instead (the value it printed or used is not in scope there); no local edit is known to keep the script's "
    "behaviour, and a diff that only deletes the line would drop what the user wanted from it"
)


def _fix(site: ev.Site, reason: str) -> AgentChange:
    code = patches.line_text(site.file, site.line)
    if ".item()" in code or "item()" in reason:
        return AgentChange(
            "Let Dynamo trace the scalar read instead of breaking the graph (or keep the value as a tensor).",
            patches.insert_after_torch_import(site.file, CAPTURE_SCALARS),
        )
    if code.startswith("print(") or "print" in reason:
        return AgentChange(
            f"Move `{code}` out of the compiled function (log from the caller every N steps).", no_diff_reason=NO_DIFF
        )
    return AgentChange(
        f"Rewrite `{code}` so Dynamo can trace it, or move it out of the compiled function.", no_diff_reason=NO_DIFF
    )


def _best_reason(events: Sequence[ev.GraphBreak]) -> str:
    """Dynamo's explanation when some record has it, rather than the generic "Encountered graph break" line."""
    reasons = [e.reason for e in events]
    specific = [r for r in reasons if not r.startswith(GENERIC_REASON)]
    return (specific or reasons)[0]


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    breaks = [e for e in rank.events if isinstance(e, ev.GraphBreak)]
    findings = []
    for site, events in by_site(breaks).items():
        reason = _best_reason(events)
        code = patches.line_text(site.file, site.line)
        findings.append(
            RULE.finding(
                f"Graph break at {patches.display_path(site.file)}:{site.line} ({code or site.function}): {reason}",
                Evidence("graph breaks", sum(1 for e in events if e.reason == reason), 0, "breaks"),
                [Location.from_site(site)],
                "The compiled function is split into several XLA programs with host round trips between them. Dynamo's "
                "reason: " + reason,
                agent_change=_fix(site, reason),
                saving_pct=10.0,
                confidence=0.8,
                time_ns=events[0].time_ns,
                rank=rank.rank,
            )
        )
    return findings


RULE = DiagnosticRule(
    code="CO-2",
    name="graph breaks under torch.compile",
    category="compile",
    severity=Severity.warning,
    rationale="Each break ends one XLA graph and starts another, with a host round trip and no fusion across it.",
    before='@torch.compile(backend="tpu")\ndef step(x):\n    print("loss", loss)',
    after='@torch.compile(backend="tpu")\ndef step(x):\n    ...  # log outside, every N steps',
    references=(
        "docs/tpu-performance.md#compilation",
        "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
    ),
    requires=(HOOKS,),
    check=_check,
)
