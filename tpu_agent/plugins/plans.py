"""Migration plans kept between ``tpu_plan_migration`` and ``tpu_apply_plan``.

An agent plans, shows the user the diff, waits for approval, and applies, possibly many tool calls
(or a server restart) later. So a plan is stored as JSON under ``<workspace>/.tpu-agent/plans/<id>.json``
with every changed file's original sha256 and migrated content; applying reloads it into the migrate
data model and hands it to :func:`tpu_agent.migrate.api.apply`, which refuses files whose hash changed
and treats a second apply as a no-op. The id is a content hash of the plan, so planning the same tree
twice gives the same id.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from tpu_agent.errors import ExitCode, TpuAgentError, clipped
from tpu_agent.fsutil import atomic_write_text
from tpu_agent.migrate.model import (
    FileKind,
    FileResult,
    Finding,
    MigrateOptions,
    Plan,
    Safety,
    sha256_bytes,
)
from tpu_agent.plugins.workspace import Workspace

PLAN_FORMAT = 1
#: What :func:`plan_id_for` produces; anything else is not one of our plan ids.
PLAN_ID_PATTERN = r"^plan-[0-9a-f]{12}$"


@dataclass(frozen=True)
class StoredPlan:
    """A plan as the server keeps it: its id, where it lives, and the migrate ``Plan`` it rebuilds."""

    id: str
    path: Path
    plan: Plan
    diff: str


def _finding_from_dict(data: dict[str, Any]) -> Finding:
    """A finding as ``Finding.to_dict`` stored it; a malformed value raises ValueError/TypeError/KeyError, which
    :func:`load_plan` reports as a corrupt plan."""
    return Finding(
        code=str(data["code"]),
        path=str(data["path"]),
        line=int(data["line"]),
        column=int(data["column"]),
        message=str(data["message"]),
        safety=Safety(str(data["safety"])),
        fixed=bool(data["fixed"]),
        end_line=data.get("end_line"),
        end_column=data.get("end_column"),
    )


def in_workspace_terms(plan: Plan, workspace: Workspace) -> Plan:
    """Name every file and finding by its workspace-relative path (the engine names them from the cwd).

    The server's cwd is not the workspace, and agents pass workspace-relative paths back, so diffs,
    reports and findings must use those names.
    """
    for result in plan.files:
        rel = workspace.relative(result.path)
        result.display_path = rel
        result.findings = [replace(f, path=rel) for f in result.findings]
    return plan


def _plan_to_dict(plan: Plan, workspace: Workspace) -> dict[str, object]:
    files = []
    for result in sorted(plan.files, key=lambda r: workspace.relative(r.path)):
        if not result.changed and not result.findings and result.skipped_reason is None:
            continue
        files.append(
            {
                "path": workspace.relative(result.path),
                "display_path": result.display_path,
                "kind": result.kind.value,
                "original_sha256": result.original_sha256,
                "migrated_sha256": sha256_bytes(result.migrated_bytes) if result.migrated_bytes is not None else None,
                "migrated_b64": (
                    base64.b64encode(result.migrated_bytes).decode("ascii") if result.migrated_bytes else None
                ),
                "findings": [f.to_dict() for f in result.findings],
                "skipped_reason": result.skipped_reason,
                "lines": result.lines,
            }
        )
    return {
        "roots": sorted(workspace.relative(root) for root in plan.roots),
        "options": plan.options.to_dict(),
        "files": files,
        # temp files a killed earlier run left: an MCP apply removes them as a CLI apply does
        "stale_temp_files": sorted(workspace.relative(path) for path in plan.stale_temp_files),
    }


def plan_id_for(body: dict[str, object]) -> str:
    """A content hash of the stored plan: same tree, same options -> same id."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()
    return f"plan-{digest[:12]}"


def save_plan(plan: Plan, workspace: Workspace) -> StoredPlan:
    """Write ``plan`` (and its diff) under ``.tpu-agent/plans/`` and return it with its id."""
    # Imported here: the report package loads every rule, which the server must not need at start-up.
    from tpu_agent.migrate.report.diff import unified_diff

    body = _plan_to_dict(plan, workspace)
    plan_id = plan_id_for(body)
    directory = workspace.artefact_dir("plans")
    diff = unified_diff(plan)
    record = {"format": PLAN_FORMAT, "id": plan_id, "workspace": str(workspace.root), **body}
    path = workspace.state_file(directory, f"{plan_id}.json")
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    atomic_write_text(workspace.state_file(directory, f"{plan_id}.diff"), diff)
    return StoredPlan(id=plan_id, path=path, plan=plan, diff=diff)


def _plan_path(plan_id: str, workspace: Workspace) -> Path:
    if re.fullmatch(PLAN_ID_PATTERN, plan_id) is None:
        raise TpuAgentError(
            "unknown-plan",
            f"{clipped(plan_id)} is not a plan id",
            "Plan ids look like 'plan-1a2b3c4d5e6f' and come from tpu_plan_migration.",
        )
    return workspace.artefact_dir("plans") / f"{plan_id}.json"


def _is_regular_file(path: Path) -> bool:
    """True for a regular file that is not a symlink (a planted link must not make us read elsewhere)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _entry_path(rel: str, written: bool, workspace: Workspace) -> Path:
    """A stored file's path: one the plan writes is re-resolved against the sandbox (links followed, so a
    link planted since planning is refused); one it only reports (a skipped link, a file with manual
    findings) is named as stored, inside the workspace, and never opened."""
    if written:
        return workspace.resolve(rel, must_exist=False, for_write=True)
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(f"stored path {clipped(rel)} is not workspace-relative")
    return workspace.root / path


def load_plan(plan_id: str, workspace: Workspace) -> StoredPlan:
    """Rebuild a stored plan, re-checking every path against the workspace sandbox."""
    path = _plan_path(plan_id, workspace)
    if not _is_regular_file(path):
        raise TpuAgentError(
            "unknown-plan",
            f"no plan {plan_id!r} under {workspace.relative(path.parent)}/ in the workspace {workspace.root}",
            "Call tpu_plan_migration first (plans are stored per workspace), then pass its plan_id.",
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        files = []
        for entry in record["files"]:
            target = _entry_path(entry["path"], entry["migrated_b64"] is not None, workspace)
            migrated = base64.b64decode(entry["migrated_b64"]) if entry["migrated_b64"] else None
            files.append(
                FileResult(
                    path=target,
                    display_path=entry["display_path"],
                    kind=FileKind(entry["kind"]),
                    original_sha256=entry["original_sha256"],
                    migrated_bytes=migrated,
                    findings=[_finding_from_dict(f) for f in entry["findings"]],
                    skipped_reason=entry["skipped_reason"],
                    lines=entry["lines"],
                )
            )
        plan = Plan(
            roots=[workspace.resolve(root, must_exist=False) for root in record["roots"]],
            options=MigrateOptions.from_dict(record["options"]),
            files=files,
            # named as stored, never followed here: apply re-checks each is a stale temp file inside the roots
            stale_temp_files=[_entry_path(str(rel), False, workspace) for rel in record.get("stale_temp_files", [])],
        )
    except (KeyError, TypeError, ValueError) as error:
        raise TpuAgentError(
            "corrupt-plan",
            f"the stored plan {workspace.relative(path)} cannot be read ({error})",
            "Plan again with tpu_plan_migration.",
            ExitCode.REFUSED,
        ) from error
    diff_path = path.with_suffix(".diff")
    diff = diff_path.read_text(encoding="utf-8") if _is_regular_file(diff_path) else ""
    return StoredPlan(id=plan_id, path=path, plan=plan, diff=diff)


__all__ = ["PLAN_ID_PATTERN", "StoredPlan", "in_workspace_terms", "load_plan", "plan_id_for", "save_plan"]
