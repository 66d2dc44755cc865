"""The MCP tools' typed results: pydantic models, so the SDK publishes each tool's ``outputSchema`` and
returns ``structuredContent`` an agent can rely on. These models are the tool contract; the server only
fills them from the migrate, runtime and profile APIs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

JobStateName = Literal["running", "succeeded", "failed", "cancelled", "timed_out"]


class Location(BaseModel):
    path: str = Field(description="Workspace-relative path.")
    line: int = Field(ge=1, description="1-based line.")
    column: int = Field(ge=1, description="1-based column.")


class ScanFinding(BaseModel):
    rule: str = Field(description="Stable rule code, e.g. TPU101; tpu_explain_rule explains it.")
    safety: Literal["safe", "unsafe", "manual"] = Field(
        description="safe: rewritten by default; unsafe: rewritten only with unsafe_fixes; manual: a person ports it."
    )
    location: Location
    message: str
    fixed: bool = Field(description="True when tpu_plan_migration would rewrite it with the same options.")


class ScanResult(BaseModel):
    workspace: str
    files_scanned: int
    files_with_findings: int
    findings: list[ScanFinding]
    rule_counts: dict[str, int] = Field(description="Findings per rule code, over all files (not truncated).")
    truncated: bool = Field(description="True when more findings exist than max_findings.")
    skipped: list[str] = Field(description="Files the engine could not read, each with the reason.")


class ChangedFile(BaseModel):
    path: str
    sha256_before: str
    sha256_after: str
    fixes: int = Field(description="Findings this file's rewrite resolves.")


class PlanResult(BaseModel):
    plan_id: str = Field(description="Pass to tpu_apply_plan after the user approved the diff.")
    plan_path: str = Field(description="Workspace-relative JSON file holding the plan.")
    diff_uri: str = Field(description="Resource URI with the full diff.")
    files_changed: list[ChangedFile]
    file_hashes: dict[str, str] = Field(description="sha256 of every file the plan changes, as read when planning.")
    diff: str = Field(description="Unified diff of every change (truncated to max_diff_chars).")
    diff_truncated: bool
    report: str = Field(description="Markdown migration report: what changed, what needs a person.")
    manual_followups: list[ScanFinding] = Field(description="Findings the plan does not fix.")
    next_action: str


class ApplyResult(BaseModel):
    plan_id: str
    applied: bool = Field(description="True when this call wrote files.")
    already_applied: bool = Field(description="True when the tree already matched the plan (second apply).")
    files_written: list[str]
    files_unchanged: list[str]
    next_action: str


class JobResult(BaseModel):
    job_id: str
    kind: Literal["run", "profile", "estimate", "check"]
    state: JobStateName
    exit_code: int | None
    elapsed_s: float
    command: list[str] = Field(description="The argv the job runs (no shell).")
    log_path: str = Field(description="Workspace-relative log file.")
    log_uri: str
    log_tail: list[str] = Field(description="Last lines of the merged stdout/stderr.")
    log_truncated: bool = Field(description="True when output passed the log cap and later output was dropped.")
    profile_dir: str | None = Field(default=None, description="Workspace-relative profile directory (profile jobs).")
    estimate_path: str | None = Field(
        default=None, description="Workspace-relative estimate JSON (estimate jobs; docs/estimate-json-schema.md)."
    )
    check_path: str | None = Field(
        default=None, description="Workspace-relative check report JSON (check jobs; `tpu-agent check --format json`)."
    )
    next_action: str


class CancelResult(BaseModel):
    job_id: str
    state: JobStateName
    was_running: bool


class DiagnosticItem(BaseModel):
    rule: str = Field(description="Stable diagnostic id.")
    name: str
    category: str = Field(
        description="capture | host sync | eager-mode | compile | shapes | precision | input pipeline | sharding"
    )
    severity: str
    title: str
    suggested_change: str = Field(description="The code or configuration change that addresses the finding.")
    agent_change: str | None = Field(description="What to edit, when the change is local.")
    agent_diff: str | None = Field(
        description="A unified diff implementing the change, when one is known; apply it only when diff_verified."
    )
    diff_verified: bool = Field(
        description="True when profile applied agent_diff to a copy of the script, ran it, saw the same losses and "
        "the finding gone (or its measure lower)."
    )
    verification: str | None = Field(
        description="Why the diff is or is not verified (a diff that failed its check is withheld: advice only)."
    )
    locations: list[str] = Field(description="Source locations as 'path:line', most costly first.")
    estimated_saving_pct: float = Field(description="Estimated share of step time the change saves.")
    detail: dict[str, Any] = Field(description="The profile API's full finding (evidence, confidence, rank).")


class DiagnoseResult(BaseModel):
    logdir: str
    chip: str
    findings: list[DiagnosticItem]
    truncated: bool
    report: str = Field(description="Markdown diagnosis report.")
    next_action: str


class RuleExplanation(BaseModel):
    code: str
    name: str
    family: str
    safety: Literal["safe", "unsafe", "manual"]
    summary: str
    rationale: str
    before: str
    after: str
    reference: str
    since_torch: str | None


class ApiMappingItem(BaseModel):
    cuda: str
    tpu: str
    status: str = Field(description="rewrite | unsafe-rewrite | manual")
    status_meaning: str
    note: str
    reference: str


class ApiLookupResult(BaseModel):
    query: str
    matches: list[ApiMappingItem]


class Problem(BaseModel):
    code: str
    message: str
    hint: str


class DoctorResult(BaseModel):
    tpu_agent_version: str
    python: str
    workspace: str | None
    workspace_source: str | None
    runtime: dict[str, Any] = Field(description="The runtime's doctor report (backend choice, torch, torch_tpu, chip).")
    limits: dict[str, int] = Field(
        description="This server's bounds: max_jobs running at once (more get busy), max_ranks per job."
    )
    problems: list[Problem]


__all__ = [
    "ApiLookupResult",
    "ApiMappingItem",
    "ApplyResult",
    "CancelResult",
    "ChangedFile",
    "DiagnoseResult",
    "DiagnosticItem",
    "DoctorResult",
    "JobResult",
    "Location",
    "PlanResult",
    "Problem",
    "RuleExplanation",
    "ScanFinding",
    "ScanResult",
]
