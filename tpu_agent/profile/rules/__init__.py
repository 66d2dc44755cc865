"""The diagnostic rules, one module each, and the engine that runs them over a :class:`ProfileModel`.

Every rule runs on every capture and leaves a :class:`RuleOutcome`: ``ok``, ``finding`` or
``insufficient_data`` (with the data it lacked). A rule without the data it needs never gives a verdict.
"""

from __future__ import annotations

from dataclasses import replace
from importlib import import_module
from pkgutil import iter_modules

from tpu_agent.errors import TpuAgentError
from tpu_agent.profile.model import Finding, ProfileModel, RuleOutcome, Status
from tpu_agent.profile.patches import line_text
from tpu_agent.profile.rules._base import DiagnosticRule, Insufficient, available

# The code families in report order (capture problems first: they make the rest unreliable); a module's name
# starts with its family (``hs_device_copy`` holds HS-2).
FAMILIES = ("CAP", "HS", "EM", "CO", "SH", "PR", "IP", "SD")


def order(rule: DiagnosticRule) -> tuple[int, int]:
    """Where ``rule`` stands in the catalogue: by family as :data:`FAMILIES` lists them, then by number."""
    family, _, number = rule.code.partition("-")
    return FAMILIES.index(family), int(number)


def _discover() -> dict[str, DiagnosticRule]:
    """Every ``RULE`` of this package's public modules (one diagnostic per module), in :func:`order`. Derived, not
    listed: a rule module added here is run, shown by ``tpu-agent rules`` and documented without another list to
    keep in step."""
    rules = [import_module(f"{__name__}.{info.name}").RULE for info in iter_modules(__path__) if info.name[0] != "_"]
    return {rule.code: rule for rule in sorted(rules, key=order)}


ALL_RULES: dict[str, DiagnosticRule] = _discover()

_DATA_HINTS = {
    "steps": "no step boundaries were recorded",
    "op_trace": "no torch.profiler op trace with shapes",
    "hooks": "not captured by `tpu-agent profile` (no call sites, DataLoader, weights or env)",
    "eager_mode": "the TorchTPU eager mode is unknown (run on the tpu-agent runtime or pass --eager-mode)",
    "memory": "no parameter/optimizer memory measurement",
    "compiled": "the step was not compiled for a TPU (libtpu is not installed, or --no-tpu-compiler)",
}


def get_rule(rule_id: str) -> DiagnosticRule:
    """Look a rule up by id (e.g. ``HS-1``), with an error that lists the valid ones."""
    try:
        return ALL_RULES[rule_id.upper()]
    except KeyError:
        raise TpuAgentError(
            "unknown-rule", f"unknown diagnostic rule {rule_id!r}", f"use one of: {', '.join(ALL_RULES)}"
        ) from None


def run_rules(model: ProfileModel) -> tuple[list[Finding], list[RuleOutcome]]:
    """Run every rule; capture problems first, then by severity, then by estimated saving."""
    have = available(model)
    findings: list[Finding] = []
    outcomes: list[RuleOutcome] = []
    for rule in ALL_RULES.values():
        missing = [need for need in rule.requires if need not in have]
        if missing:
            reason = "; ".join(_DATA_HINTS[m] for m in missing)
            outcomes.append(RuleOutcome(rule.code, Status.insufficient_data, reason))
            continue
        try:
            found = rule.check(model)
        except Insufficient as why:
            outcomes.append(RuleOutcome(rule.code, Status.insufficient_data, str(why)))
            continue
        for finding in found:
            finding.locations = [
                replace(loc, code=loc.code or line_text(loc.file, loc.line)) for loc in finding.locations
            ]
        findings.extend(found)
        outcomes.append(RuleOutcome(rule.code, Status.finding if found else Status.ok, "", len(found)))
    findings.sort(key=lambda f: (f.category != "capture", f.severity.rank, -f.estimated_saving_pct, f.rule_id))
    return findings, outcomes


__all__ = ["ALL_RULES", "FAMILIES", "DiagnosticRule", "get_rule", "order", "run_rules"]
