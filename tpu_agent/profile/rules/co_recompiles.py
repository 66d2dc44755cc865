"""CO-1: recompilation churn after warm-up, with the guard that failed (what changed)."""

from __future__ import annotations

import ast
import re
from collections import Counter

from tpu_agent.profile import patches, sources
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule, by_site, window_steps
from tpu_agent.runtime import events as ev

PER_STEP_ERROR = 0.5  # recompiles per step from which a finding is an error


def _advice(reason: str) -> str:
    if "size mismatch" in reason or "stride mismatch" in reason:
        return "An input shape changes between calls: pad or bucket it to a few fixed sizes, or use drop_last=True."
    if "requires_grad mismatch" in reason:
        return "A parameter's requires_grad changed between calls (a layer frozen or unfrozen): the graph recompiles."
    if "___stack" in reason or "== " in reason or "id(" in reason:
        return (
            "A Python value the graph depends on changes: pass it as a tensor or hoist it out of the compiled region."
        )
    return "Keep the compiled function's inputs (shapes, dtypes, Python constants) the same every call."


def shape_change(recompiles: list[ev.Compile]) -> tuple[list[Location], AgentChange | None]:
    """Where the tensor whose shape broke the guard is created, and the edit that pads it to a bucket (SH-1 takes
    the place too, for a model called inside a compiled region, where no forward call is seen).

    The guard names the compiled function's argument and dimension; the first call that passes it is
    followed back to the assignment that creates the tensor (:mod:`tpu_agent.profile.sources`).
    """
    for event in recompiles:
        guard = sources.parse_guard(event.reason)
        if guard is None or event.site is None:
            continue
        origin = sources.origin_of_argument(event.site.file, event.function, guard.argument, event.site.line)
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
        return sources.shape_change(event.site.file, origin, guard.dim, sizes, what=f"the {guard.argument!r} argument")
    return [], None


_CONSTANT_GUARD = re.compile(r"(?:L\['(?P<quoted>[A-Za-z_]\w*)'\]|\b(?P<name>[A-Za-z_]\w*)) == [-+.\w]+")


def _scalar_change(recompiles: list[ev.Compile]) -> tuple[list[Location], AgentChange | None]:
    """A Python number passed to the compiled function that changes each call (Dynamo guards ``scale == 0.05``):
    the call that passes it, and the edit that passes it as a 0-d tensor on the device of the call's tensor
    argument, which the compiled graph takes as an input instead of a constant."""
    for event in recompiles:
        match = _CONSTANT_GUARD.search(event.reason)
        if match is None or event.site is None:
            continue
        argument = match["quoted"] or match["name"]
        passed = sources.scalar_argument(event.site.file, event.function, argument, event.site.line)
        if passed is None:
            continue
        where = Location(event.site.file, passed.line, sources.function_at(event.site.file, passed.line))
        tensor = f"torch.tensor({passed.expression}, device={passed.tensor}.device)" if passed.tensor else None
        diff = (
            patches.replace_on_line(  # at the expression's column: `s` in `loss = step(x, s)` is not the s of loss
                event.site.file,
                passed.line,
                f"^(.{{{passed.column}}}){re.escape(passed.expression)}",
                "\\g<1>" + tensor.replace("\\", "\\\\"),
            )
            if tensor and "torch" in (sources.read_source(event.site.file) or "")
            else None
        )
        return [where], AgentChange(
            f"`{passed.expression}` (passed as {argument!r} at line {passed.line}) is a Python number that changes "
            "every call: each value is a new compile. Pass it as a tensor"
            + (f" (`{tensor}`)" if tensor else "")
            + " so the compiled graph takes it as an input.",
            diff,
        )
    return [], None


_REQUIRES_GRAD_GUARD = re.compile(r"tensor '(?P<path>.*?)' requires_grad mismatch")
_MODULE_NAME = re.compile(r"_modules\['(\w+)'\]")
FREEZE_NO_DIFF = (
    "the edit that avoids it changes which parameters train, or how (the optimizer's groups), and with them the losses "
    "after the change: no edit keeps the script's numbers, which a verified diff must"
)


def _requires_grad_lines(path: str) -> list[int]:
    """Lines that change a tensor's ``requires_grad``: ``p.requires_grad_(...)``, ``p.requires_grad = ...``."""
    tree = sources.parse_source(path)
    if tree is None:
        return []
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "requires_grad_":
            lines.add(node.lineno)
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in targets):
                lines.add(node.lineno)
    return sorted(lines)


def _requires_grad_change(
    recompiles: list[ev.Compile], script: str | None
) -> tuple[list[Location], AgentChange | None]:
    """A parameter frozen or unfrozen between calls (Dynamo guards ``requires_grad``): the line that flips it, in
    the compiled function's file or the script, preferring one that names the guarded module."""
    for event in recompiles:
        match = _REQUIRES_GRAD_GUARD.search(event.reason)
        if match is None:
            continue
        names = _MODULE_NAME.findall(match["path"])
        files = dict.fromkeys(f for f in (event.site.file if event.site else None, script) if f)
        found = [(f, line) for f in files for line in _requires_grad_lines(f)]
        if not found:
            continue
        text = {place: patches.line_text(*place) for place in found}
        named = [place for place in found if any(name in text[place] for name in names)]
        file, line = (named or found)[0]
        module = names[0] if names else "a module"
        return [Location(file, line, sources.function_at(file, line))], AgentChange(
            f"Line {line} changes `requires_grad` of {module}'s parameters, which the compiled graph is guarded on: "
            "each change is a recompile. Once (unfreezing at an epoch boundary) it costs one compile; if it changes "
            "often, keep requires_grad fixed and stop the updates another way (leave those parameters out of the "
            "optimizer's groups, or set their learning rate to 0 until they train).",
            no_diff_reason=FREEZE_NO_DIFF,
        )
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
    created, padding = shape_change(recompiles)
    if padding is None:
        created, padding = _scalar_change(recompiles)
    if padding is None:
        created, padding = _requires_grad_change(recompiles, model.config.script)
    locations = created + [Location.from_site(site) for site in list(sites)[:3]]
    return [
        RULE.finding(
            f"{len(recompiles)} recompilation(s) of {', '.join(functions)} after warm-up: {top_reason}",
            Evidence(
                "recompiles per step",
                round(per_step, 2),
                0,  # any recompile after warm-up is a finding (one unfreeze included); PER_STEP_ERROR sets the severity
                "per step",
                tuple(sorted({e.step for e in recompiles if e.step is not None})),
            ),
            locations,
            _advice(top_reason)
            + (f" The changing value is made at line {created[0].line}." if created else "")
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
    code="CO-1",
    name="recompilation churn",
    category="compile",
    severity=Severity.error,
    rationale="TorchTPU compiles static shapes; a guard failure every step means a full XLA compile every step.",
    before="batch = torch.randn(16 + 8 * step, 256, device=device)\nloss = compiled_step(batch)",
    after="batch = torch.randn(16 + 8 * step, 256, device=device)\n"
    "batch = torch.nn.functional.pad(batch, (0, 0, 0, -batch.shape[0] % 128))  # one shape; mask the padding\n"
    "loss = compiled_step(batch)",
    references=(
        "docs/tpu-performance.md#compilation",
        "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
    ),
    requires=(STEPS, HOOKS),
    check=_check,
)
