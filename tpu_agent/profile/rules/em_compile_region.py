"""EM-3: the step runs eagerly with nothing compiled; names the region to wrap in torch.compile."""

from __future__ import annotations

import re

from tpu_agent.profile import patches
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule, ops_per_step
from tpu_agent.runtime import events as ev

OPS_THRESHOLD = 50
COMPILE = 'torch.compile(backend="tpu")'


def _def_line(path: str, function: str, before_line: int) -> int | None:
    for line in range(before_line, 0, -1):
        if re.match(rf"\s*(async\s+)?def\s+{re.escape(function)}\s*\(", patches.line_text(path, line) + " "):
            return line
    return None


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    if any(isinstance(e, (ev.Compile, ev.GraphBreak)) for e in rank.events):
        return []
    count = ops_per_step(rank)
    if count < OPS_THRESHOLD:
        return []
    site = rank.step_site or rank.forward_site
    if site is None:
        return []
    diff = None
    if site.function != "<module>" and not patches.in_loop(site.file, site.line):
        line = _def_line(site.file, site.function, site.line)
        diff = patches.add_decorator(site.file, line, COMPILE) if line else None
        region = f"the step function `{site.function}`"
    else:
        model_class = rank.module_types[0] if rank.module_types else "the model"
        region = (
            f"the {model_class} model (called at {patches.display_path(site.file)}:{(rank.forward_site or site).line})"
        )
        if rank.module_types:
            diff = patches.wrap_model_after_construction(
                site.file, model_class, site.line, 'torch.compile({var}, backend="tpu")'
            )
    return [
        RULE.finding(
            f"Nothing is compiled: {count:.0f} ops per step run eagerly",
            Evidence("ops per step outside compiled graphs", count, OPS_THRESHOLD, "ops"),
            [Location.from_site(site)],
            f"Compile {region} with {COMPILE}: one XLA graph per step, fused and with donated buffers.",
            severity=Severity.info,
            agent_change=AgentChange(
                f"Wrap {region} in {COMPILE}"
                + ("" if diff else ' (e.g. `model = torch.compile(model, backend="tpu")` after the model is built).'),
                diff,
            ),
            saving_pct=0.0,
            confidence=0.5,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    id="EM-3",
    name="region to compile",
    category="compile",
    severity=Severity.info,
    rationale='torch.compile(backend="tpu") turns the step into one XLA program; TorchTPU recommends it over eager.',
    before="def train_step(x, y):",
    after='@torch.compile(backend="tpu")\ndef train_step(x, y):',
    reference="docs/tpu-performance.md#eager-modes; https://pytorch.org/docs/stable/torch.compiler.html",
    requires=(STEPS, HOOKS),
    check=_check,
)
