"""CAP-6: a debug setting (launch blocking, debug checks, HLO dumps) left on makes timings meaningless."""

from __future__ import annotations

from tpu_agent.profile.model import Evidence, Finding, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, DiagnosticRule
from tpu_agent.runtime.envvars import DEBUG_CHECKS, DEBUG_EAGER, eager_mode_from_env


def _check(model: ProfileModel) -> list[Finding]:
    env = model.config.env
    causes: list[str] = []
    # the capture's environment read exactly as the run read it (envvars owns the names and their precedence)
    mode, source = eager_mode_from_env(env)
    if mode is DEBUG_EAGER:
        causes.append(source)
    elif model.config.eager_mode == DEBUG_EAGER.enum_name:
        causes.append(f"eager mode {DEBUG_EAGER.enum_name} ({DEBUG_EAGER.doc_name})")
    checks = DEBUG_CHECKS.on_source(env)
    if checks is not None:
        causes.append(checks)
    if "xla_dump_to" in env.get("XLA_FLAGS", ""):
        causes.append("XLA_FLAGS dumps HLO (--xla_dump_to)")
    if "xla_optimization_level=O0" in env.get("TORCH_TPU_INTERNAL_XLA_OPTIONS", ""):
        causes.append("XLA optimisation level O0")
    if not causes:
        return []
    return [
        RULE.finding(
            "Debug settings are on: " + ", ".join(causes),
            Evidence("debug settings", len(causes), 0, "settings"),
            [],
            "Unset these for performance measurement; Debug Eager waits for every op and runs expensive checks, so "
            "the step times in this profile are not what the job will see.",
            confidence=0.95,
        )
    ]


RULE = DiagnosticRule(
    code="CAP-6",
    name="debug mode left on",
    category="capture",
    severity=Severity.error,
    rationale="Launch-blocking and debug checks serialise host and device; a profile under them measures the debugger.",
    before="TORCH_TPU_LAUNCH_BLOCKING=1 tpu-agent profile train.py",
    after="tpu-agent profile train.py",
    references=("docs/tpu-performance.md#capture-validity",),
    requires=(HOOKS,),
    check=_check,
)
