"""Shared by HS-1 and HS-2: host syncs per call site, and the local fix for scalar accumulation."""

from __future__ import annotations

from tpu_agent.profile import patches
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import DiagnosticRule, Insufficient, by_site, in_window, step_ns, window_steps
from tpu_agent.runtime import events as ev

# A device-to-host read drains the TorchTPU queue: the host waits for every pending op, then the device idles
# until the host dispatches again. 100 µs per sync is the assumed round-trip cost on a TPU VM.
SYNC_COST_NS = 100_000
PER_STEP_THRESHOLD = 0.5
ERROR_SHARE = 30.0
ACCUMULATE = r"(\+=\s*.*?)\.item\(\)"


def accumulation_fix(site: ev.Site) -> AgentChange | None:
    """``total += loss.item()`` -> ``total += loss.detach()``: the sum stays on the device, read once later."""
    diff = patches.replace_on_line(site.file, site.line, ACCUMULATE, r"\1.detach()")
    if diff is None:
        return None
    return AgentChange(
        "Accumulate on the device instead of reading a Python float every step; convert once after the loop "
        "(e.g. `float(total)` where the total is printed).",
        diff,
    )


def sync_findings(rule: DiagnosticRule, model: ProfileModel, ops: frozenset[str], what: str) -> list[Finding]:
    rank = model.primary
    steps = window_steps(rank)
    if not steps:
        raise Insufficient("no complete step inside the measured window")
    median = step_ns(rank)
    syncs = [e for e in in_window(rank, rank.events) if isinstance(e, ev.HostSync) and e.op in ops]
    findings = []
    for site, events in by_site(syncs).items():
        per_step = len(events) / len(steps)
        if per_step < PER_STEP_THRESHOLD:
            continue
        saving = min(per_step * SYNC_COST_NS / median * 100, 60.0)
        kinds = sorted({e.op for e in events})
        change = accumulation_fix(site) if "item" in kinds else None
        if change is None:
            change = AgentChange(
                f"Move the `{'/'.join(kinds)}` call at {patches.display_path(site.file)}:{site.line} out of the step, "
                "or "
                "run it every N steps (`if step % 100 == 0:`); keep the value as a tensor until then."
            )
        code = patches.line_text(site.file, site.line)
        findings.append(
            rule.finding(
                f"{what} `{'/'.join(kinds)}` {per_step:.1f}x per step at {patches.display_path(site.file)}:{site.line}"
                + (f": {code}" if code else ""),
                Evidence(
                    "host syncs per step",
                    round(per_step, 2),
                    PER_STEP_THRESHOLD,
                    "per step",
                    tuple(sorted({e.step for e in events if e.step is not None})),
                ),
                [Location.from_site(site, share_of_step=round(saving / 100, 4))],
                "Each read waits for all queued TPU work and leaves the TPU idle until the host catches up; in "
                "DeferAndFuse it also cuts the fused graph. Keep values on the device and read them rarely.",
                severity=Severity.error if saving >= ERROR_SHARE else rule.severity,
                agent_change=change,
                saving_pct=saving,
                confidence=0.75,
                time_ns=events[0].time_ns,
                rank=rank.rank,
            )
        )
    return findings
