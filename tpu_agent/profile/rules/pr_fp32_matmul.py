"""PR-1: matmuls running in fp32 where bf16 (autocast) would do."""

from __future__ import annotations

import math
import re

from tpu_agent.profile import patches
from tpu_agent.profile.amp_context import AutocastContext, enclosing_autocast
from tpu_agent.profile.flags import command_line_value
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.op_classes import MXU_OPS
from tpu_agent.profile.rules._base import (
    HOOKS,
    OP_TRACE,
    STEPS,
    DiagnosticRule,
    matmul_time_share,
    window_steps,
)
from tpu_agent.profile.sources import function_at

FP32_SHARE_THRESHOLD = 0.5
# An fp32 matmul at full precision takes several bf16 MXU passes and twice the HBM traffic; 3x is the assumption.
FP32_SLOWDOWN = 3.0
AUTOCAST = 'torch.autocast("tpu", dtype=torch.bfloat16)'
BF16 = "bfloat16"
MASTER_WEIGHTS = "keep fp32 master weights and optimizer state (no GradScaler is needed with bf16)."


def _context_change(path: str, line: int, context: AutocastContext, args: list[str]) -> tuple[str, str | None]:
    """What to change in the autocast the forward already runs under (never a second autocast nested inside)."""
    name = patches.display_path(path)
    under = f"{name}:{line} already runs under `{context.expression}`"
    if context.call_line != context.with_line:
        under += f", the autocast set up at {name}:{context.call_line} (`{context.call}`)"
    setting = context.setting
    override = command_line_value(args, setting.name) if setting is not None else None
    if context.dtype is None:
        diff = patches.add_call_kwargs(path, context.call_line, context.callee, {"dtype": "torch.bfloat16"})
        return f"{under}, which sets no dtype (the device's default): pass dtype=torch.bfloat16 to it.", diff
    if context.dtype_literal is not None and context.dtype_line is not None and context.resolved_dtype != BF16:
        diff = patches.replace_on_line(path, context.dtype_line, re.escape(context.dtype_literal), "torch.bfloat16")
        return f"{under}, whose dtype is {context.dtype_literal}: make that torch.bfloat16.", diff
    if setting is not None and override is not None and override != BF16:
        return (
            f"{under}; its dtype comes from `{setting.name}` ({name}:{setting.line}), which this run set to "
            f"{override!r} with --{setting.name}={override}: run with --{setting.name}={BF16}.",
            None,
        )
    if setting is not None and override is None and setting.literal not in (None, BF16):
        diff = patches.replace_on_line(path, setting.line, re.escape(setting.source), repr(BF16))
        return (
            f"{under}; its dtype comes from `{setting.name} = {setting.source}` ({name}:{setting.line}): set it to {BF16!r}.",
            diff,
        )
    nullcontext = f"`{context.expression}` is nullcontext() when `{context.fallback}`" if context.fallback else ""
    if setting is not None and override is None and setting.literal is None:
        return (
            f"{under}; its dtype comes from `{setting.name}` ({name}:{setting.line}), which gave fp32 matmuls in "
            f"this run: make it {BF16!r} (--{setting.name}={BF16} where the script takes overrides)"
            + (f"; note that {nullcontext}." if nullcontext else "."),
            None,
        )
    if nullcontext:
        return (
            f"{under} with dtype {context.dtype}, but {nullcontext}: that branch ran here; make it false on TPU.",
            None,
        )
    return (
        f"{under} with dtype {context.dtype}, yet these matmuls ran in fp32: check that its device_type is "
        '"tpu", that it is enabled, and that the dtype is torch.bfloat16.',
        None,
    )


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    steps = set(window_steps(rank))
    matmuls = [op for op in rank.ops if op.costed and op.step in steps and op.name in MXU_OPS and op.flops]
    total = sum(op.flops for op in matmuls)
    if not total:
        return []
    fp32 = sum(op.flops for op in matmuls if next((t for t in op.input_dtypes if t), "") == "float")
    fp32_share = fp32 / total
    if fp32_share < FP32_SHARE_THRESHOLD:
        return []
    saving = matmul_time_share(rank) * fp32_share * (1 - 1 / FP32_SLOWDOWN) * 100
    locations = []
    suggestion = (
        'TPUs compute natively in bf16. Run the forward pass under autocast("tpu", dtype=torch.bfloat16); '
        + MASTER_WEIGHTS
    )
    change = AgentChange(f"Run the model's forward (and loss) under `with {AUTOCAST}:`.")
    if rank.forward_site:
        path, line = rank.forward_site.file, rank.forward_site.line
        locations.append(Location.from_site(rank.forward_site, round(saving / 100, 4)))
        context = enclosing_autocast(path, line)
        if context is None:
            change = AgentChange(change.description, patches.wrap_line_in_with(path, line, AUTOCAST))
        else:
            description, diff = _context_change(path, line, context, model.config.script_args)
            change = AgentChange(description, diff)
            suggestion = (
                f"TPUs compute natively in bf16. {description} Change that context rather than nesting a second "
                "autocast inside it; " + MASTER_WEIGHTS
            )
            extra = [context.call_line] + ([context.setting.line] if context.setting else [])
            locations.extend(Location(path, n, function_at(path, n)) for n in dict.fromkeys(extra) if n != line)
    fp32_weights = sorted(
        (w for w in rank.weights if w.dtype == "float32" and w.site), key=lambda w: -math.prod(w.shape)
    )
    weight_sites = list(dict.fromkeys(w.site for w in fp32_weights if w.site))  # one per line: layers share one
    locations.extend(Location.from_site(site) for site in weight_sites[:3])
    return [
        RULE.finding(
            f"{fp32_share:.0%} of matmul FLOPs run in fp32",
            Evidence("fp32 share of matmul FLOPs", round(fp32_share, 3), FP32_SHARE_THRESHOLD, "fraction"),
            locations,
            suggestion,
            agent_change=change,
            saving_pct=saving,
            confidence=0.6,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="PR-1",
    name="fp32 matmuls",
    category="precision",
    severity=Severity.warning,
    rationale="fp32 matmuls need several bf16 MXU passes and move twice the bytes of bf16.",
    before="loss = loss_fn(model(x), y)",
    after='with torch.autocast("tpu", dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)',
    references=(
        "docs/tpu-performance.md#precision",
        "https://cloud.google.com/tpu/docs/bfloat16",
    ),
    requires=(STEPS, OP_TRACE, HOOKS),
    check=_check,
)
