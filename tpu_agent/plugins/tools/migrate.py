"""The migration tools: scan, plan, apply, and the knowledge behind them (rule explanations, API lookup).

Each is a thin wrapper over ``tpu_agent.migrate.api`` (imported inside the tools, so ``tools/list`` does not
load the rules). Rule selections go to the migrate library as given; it canonicalises and validates them,
and a selection it refuses reaches the agent as ``invalid-argument``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from tpu_agent.errors import TpuAgentError
from tpu_agent.plugins import api_lookup, models
from tpu_agent.plugins.limits import MAX_QUERY_CHARS
from tpu_agent.plugins.plans import in_workspace_terms, load_plan, save_plan
from tpu_agent.plugins.tools.args import PathsArg, PlanIdArg, RuleCodeArg, RuleCodes, WorkspaceArg
from tpu_agent.plugins.tools.common import (
    URI_SCHEME,
    ToolSpec,
    in_thread,
    progress_relay,
    server_state,
    tool_hints,
)
from tpu_agent.plugins.workspace import Workspace

#: Codes the migrate library uses when it refuses a rule selection (a typo, an empty list, an unknown code).
RULE_SELECTION_ERRORS = frozenset({"unknown-rule", "unknown-rule-code", "bad-rule-selection"})


@contextmanager
def _rule_selection_is_an_argument() -> Iterator[None]:
    """A rule selection the library refuses is the caller's argument error, whatever code the library uses."""
    try:
        yield
    except TpuAgentError as error:
        if error.code not in RULE_SELECTION_ERRORS:
            raise
        raise TpuAgentError(
            "invalid-argument",
            f"select/ignore: {error.message}",
            "Pass rule codes or prefixes from tpu_scan's findings or the tpu-agent://rules resource (e.g. 'TPU1').",
        ) from error


def _finding_to_scan(finding: Any) -> models.ScanFinding:
    return models.ScanFinding(
        rule=finding.code,
        safety=finding.safety.value,
        location=models.Location(path=finding.path, line=max(1, finding.line), column=max(1, finding.column)),
        message=finding.message,
        fixed=finding.fixed,
    )


def _plan_findings(plan: Any) -> list[models.ScanFinding]:
    out = [_finding_to_scan(finding) for finding in plan.findings]
    return sorted(out, key=lambda f: (f.location.path, f.location.line, f.location.column, f.rule))


async def _build_plan(
    ctx: Context,
    ws: Workspace,
    paths: Sequence[str],
    *,
    select: list[str] | None,
    ignore: list[str] | None = None,
    unsafe_fixes: bool = False,
    target: str = "accelerator",
) -> Any:
    targets = [ws.resolve(p) for p in paths]
    from tpu_agent.migrate import api as migrate_api
    from tpu_agent.migrate.model import MigrateOptions, Target

    relay = progress_relay(ctx)
    with _rule_selection_is_an_argument():
        options = MigrateOptions(
            select=frozenset(select) if select is not None else None,
            ignore=frozenset(ignore or ()),
            unsafe_fixes=unsafe_fixes,
            target=Target(target),
        )
        plan = await in_thread(lambda: migrate_api.plan(targets, options, progress=relay))
    return in_workspace_terms(plan, ws)


async def tpu_scan(
    ctx: Context,
    paths: PathsArg = ["."],  # noqa: B006 - pydantic copies defaults
    select: RuleCodes = None,
    max_findings: Annotated[int, Field(ge=1, le=2000, description="Cap on returned findings.")] = 200,
    workspace: WorkspaceArg = None,
) -> models.ScanResult:
    ws = await server_state(ctx).workspace(ctx, workspace)
    plan = await _build_plan(ctx, ws, paths, select=select)
    findings = _plan_findings(plan)
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.rule] = counts.get(finding.rule, 0) + 1
    return models.ScanResult(
        workspace=str(ws.root),
        files_scanned=len(plan.files),
        files_with_findings=sum(1 for r in plan.files if r.findings),
        findings=findings[:max_findings],
        rule_counts=dict(sorted(counts.items())),
        truncated=len(findings) > max_findings,
        skipped=[f"{ws.relative(r.path)}: {r.skipped_reason}" for r in plan.files if r.skipped_reason],
    )


async def tpu_plan_migration(
    ctx: Context,
    paths: PathsArg = ["."],  # noqa: B006
    select: RuleCodes = None,
    ignore: RuleCodes = None,
    unsafe_fixes: Annotated[
        bool, Field(description="Also apply rewrites that rest on a stated assumption (rule safety 'unsafe').")
    ] = False,
    target: Annotated[
        Literal["accelerator", "tpu"],
        Field(description="accelerator: device-agnostic torch.accelerator code; tpu: literal 'tpu' forms."),
    ] = "accelerator",
    max_diff_chars: Annotated[int, Field(ge=1000, le=400_000)] = 60_000,
    workspace: WorkspaceArg = None,
) -> models.PlanResult:
    ws = await server_state(ctx).workspace(ctx, workspace)
    plan = await _build_plan(ctx, ws, paths, select=select, ignore=ignore, unsafe_fixes=unsafe_fixes, target=target)
    stored = await in_thread(lambda: save_plan(plan, ws))
    from tpu_agent.migrate import model as migrate_model
    from tpu_agent.migrate import report as migrate_report

    changed = [
        models.ChangedFile(
            path=ws.relative(r.path),
            sha256_before=r.original_sha256,
            sha256_after=migrate_model.sha256_bytes(r.migrated_bytes or b""),
            fixes=r.converted_references,
        )
        for r in sorted(plan.changed_files, key=lambda r: ws.relative(r.path))
    ]
    report = migrate_report.render(plan, "markdown")
    return models.PlanResult(
        plan_id=stored.id,
        plan_path=ws.relative(stored.path),
        diff_uri=f"{URI_SCHEME}://plans/{stored.id}/diff",
        files_changed=changed,
        file_hashes={c.path: c.sha256_before for c in changed},
        diff=stored.diff[:max_diff_chars],
        diff_truncated=len(stored.diff) > max_diff_chars,
        report=report[:max_diff_chars],
        manual_followups=[f for f in _plan_findings(plan) if not f.fixed],
        next_action=(
            f"Show the diff to the user; after they approve, call tpu_apply_plan with plan_id={stored.id!r}."
            if changed
            else "Nothing to rewrite; work through manual_followups, then tpu_run."
        ),
    )


async def tpu_apply_plan(
    ctx: Context,
    plan_id: PlanIdArg,
    allow_dirty: Annotated[
        bool,
        Field(
            description="Rewrite files that have uncommitted git changes (refused by default: "
            "the user could not review or undo the rewrite with git)."
        ),
    ] = False,
    workspace: WorkspaceArg = None,
) -> models.ApplyResult:
    ws = await server_state(ctx).workspace(ctx, workspace)
    stored = load_plan(plan_id, ws)
    from tpu_agent.migrate import api as migrate_api

    try:
        result = await in_thread(lambda: migrate_api.apply(stored.plan, allow_dirty=allow_dirty))
    except TpuAgentError as error:
        if error.code == "dirty-worktree":  # the API's hint names the CLI flag; say it in tool terms
            error = dataclasses.replace(
                error,
                hint="Ask the user to commit (or stash) those files so the rewrite can be reviewed and undone "
                "with git; only if they decline, call tpu_apply_plan again with allow_dirty=true.",
            )
        raise error from None
    written = sorted(ws.relative(p) for p in result.written)
    return models.ApplyResult(
        plan_id=plan_id,
        applied=bool(written),
        already_applied=not written and bool(stored.plan.changed_files),
        files_written=written,
        files_unchanged=sorted(ws.relative(p) for p in result.unchanged),
        next_action="Call tpu_run with the training script to check it runs on the tpu device.",
    )


async def tpu_explain_rule(code: RuleCodeArg) -> models.RuleExplanation:
    from tpu_agent.migrate import rules

    return models.RuleExplanation.model_validate(rules.get_rule(code.strip().upper()).to_dict())


async def tpu_lookup_api(
    query: Annotated[
        str, Field(min_length=1, max_length=MAX_QUERY_CHARS, description="A CUDA API or idiom, or a TorchTPU API.")
    ],
    limit: Annotated[int, Field(ge=1, le=20)] = 5,
) -> models.ApiLookupResult:
    legend, _ = api_lookup.load_table()
    matches = api_lookup.lookup(query, limit)
    return models.ApiLookupResult(
        query=query,
        matches=[
            models.ApiMappingItem(
                cuda=m.cuda,
                tpu=m.tpu,
                status=m.status,
                status_meaning=legend.get(m.status, ""),
                note=m.note,
                reference=m.reference,
            )
            for m in matches
        ],
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        tpu_scan,
        "tpu_scan",
        "Find CUDA-specific code (devices, torch.cuda calls, AMP, NCCL, cuDNN flags, env vars, kernels) in "
        "workspace files. Returns findings with rule code, location and message; changes nothing. "
        "Next: tpu_plan_migration with the same paths.",
        tool_hints("Scan for CUDA code", read_only=True),
    ),
    ToolSpec(
        tpu_plan_migration,
        "tpu_plan_migration",
        "Plan the CUDA -> TorchTPU rewrite of workspace files: returns a plan_id, a unified diff and a Markdown "
        "report, and records each file's sha256. Touches no source file (the plan is stored under "
        ".tpu-agent/plans/). Show the diff to the user and wait for approval before tpu_apply_plan.",
        tool_hints("Plan a CUDA -> TPU migration", read_only=True),
    ),
    ToolSpec(
        tpu_apply_plan,
        "tpu_apply_plan",
        "Write a plan from tpu_plan_migration to the workspace (atomic writes). Refuses with stale-plan when a "
        "file changed since planning (plan again) and dirty-worktree when a file has uncommitted git changes; "
        "applying the same plan twice is a no-op. Only call after the user approved the diff.",
        tool_hints("Apply a migration plan", read_only=False, destructive=True),
    ),
    ToolSpec(
        tpu_explain_rule,
        "tpu_explain_rule",
        "Explain a migration rule by code (e.g. TPU101): what it finds, why it matters on TPU, a before/after "
        "example, and its safety.",
        tool_hints("Explain a migration rule", read_only=True),
    ),
    ToolSpec(
        tpu_lookup_api,
        "tpu_lookup_api",
        "Look up the TorchTPU equivalent of a CUDA PyTorch API (e.g. 'torch.cuda.synchronize', 'GradScaler', "
        "'nccl') in the migration rules, with its status (rewrite: migrate rewrites it by default; "
        "unsafe-rewrite: only with unsafe fixes; manual: a person ports it) and a note; or a TorchTPU API "
        "(e.g. 'OpTracer', 'set_eager_mode', 'tpu_device', 'torch.tpu._get_cache_stats', "
        "'allow_excess_precision'): status emulated, with its guide page; torch.tpu's legacy device calls "
        "(is_available, device_count...) say they are internal to TorchTPU and what replaces them.",
        tool_hints("CUDA -> TorchTPU API lookup", read_only=True),
    ),
)

__all__ = ["TOOLS", "tpu_apply_plan", "tpu_explain_rule", "tpu_lookup_api", "tpu_plan_migration", "tpu_scan"]
