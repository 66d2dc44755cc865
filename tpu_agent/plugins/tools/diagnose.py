"""The diagnose tool: what limits a profiled TPU step, each finding with its location and suggested change.

``tpu_agent.profile.api.diagnose`` writes its reports next to the capture (and, for a foreign XProf session,
an annotated copy beside the session), so the directory this tool hands it is checked first: inside the
workspace, not under ``.git/``, a real directory, and strictly below the workspace root, so that even the
session-beside-session copy lands inside the workspace. The profile library itself refuses paths a
capture's own files name outside the directory it was given.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.plugins import models
from tpu_agent.plugins.tools.args import EstimateChipArg, JobIdArg, LogdirArg, WorkspaceArg
from tpu_agent.plugins.tools.common import ServerState, ToolSpec, in_thread, server_state, tool_hints
from tpu_agent.plugins.workspace import Workspace
from tpu_agent.profile.report._common import verification_text


def _real_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _capture_of_job(state: ServerState, job_id: str) -> Path:
    job = state.jobs.get(job_id)
    if job.artefact_dir is None:
        raise TpuAgentError(
            "not-a-profile-job",
            f"job {job_id!r} is a {job.kind} job and has no profile",
            "Call tpu_profile first, then pass its job_id.",
        )
    if not job.done:
        raise TpuAgentError(
            "job-running",
            f"profile job {job_id!r} is still running ({job.elapsed_s:.0f} s so far)",
            f"Call tpu_job_status with job_id={job_id!r} and wait_s=30 until it finishes, then diagnose.",
        )
    return job.artefact_dir


def _capture_at(ws: Workspace, logdir: str) -> Path:
    """The directory ``logdir`` names, if diagnosing it can only write inside the workspace."""
    directory = ws.resolve(logdir, for_write=True)  # diagnosing writes reports next to the capture
    if directory == ws.root:
        raise TpuAgentError(
            "logdir-is-workspace",
            "logdir names the workspace root itself; diagnose writes its reports next to a capture, which here "
            "would be outside the workspace",
            "Pass the profile directory, e.g. logdir='.tpu-agent/profiles/<job_id>' or the XProf logdir "
            "'logs/profile', or pass the job_id of a tpu_profile job.",
            ExitCode.REFUSED,
        )
    if not directory.is_dir():
        raise TpuAgentError(
            "not-a-directory",
            f"logdir {ws.relative(directory)!r} is not a directory",
            "Pass the directory holding the capture (it contains tpu-agent/ or plugins/profile/).",
        )
    return directory


def _newest_capture(ws: Workspace) -> Path:
    profiles = ws.artefact_dir("profiles")
    candidates = sorted((p for p in profiles.iterdir() if _real_directory(p)), key=lambda p: os.lstat(p).st_mtime)
    if not candidates:
        raise TpuAgentError(
            "no-profile",
            f"no profile under {ws.relative(profiles)}/ in the workspace",
            "Call tpu_profile (and wait for it with tpu_job_status), or pass logdir=.",
        )
    return candidates[-1]


def _item_from_finding(data: dict[str, Any], ws: Workspace) -> models.DiagnosticItem:
    """Map one profile finding (``tpu_agent.profile.model.Finding.to_dict()``) onto the tool's item."""
    change = data.get("agent_change") or {}
    return models.DiagnosticItem(
        rule=data["rule_id"],
        name=data["name"],
        category=data["category"],
        severity=data["severity"],
        title=data["title"],
        suggested_change=data["suggestion"],
        agent_change=change.get("description"),
        agent_diff=change.get("diff"),
        diff_verified=bool(change.get("verified")),
        verification=verification_text(change) or None,
        locations=[f"{ws.relative(Path(loc['file']))}:{loc['line']}" for loc in data["locations"]],
        estimated_saving_pct=data["estimated_saving_pct"],
        detail=data,
    )


async def tpu_diagnose(
    ctx: Context,
    job_id: Annotated[JobIdArg | None, Field(description="A finished profile job.")] = None,
    logdir: LogdirArg = None,
    chip: EstimateChipArg = None,
    max_items: Annotated[int, Field(ge=1, le=100)] = 20,
    workspace: WorkspaceArg = None,
) -> models.DiagnoseResult:
    state = server_state(ctx)
    ws = await state.workspace(ctx, workspace)
    if job_id:
        directory = _capture_of_job(state, job_id)
    elif logdir:
        directory = _capture_at(ws, logdir)
    else:
        directory = _newest_capture(ws)
    from tpu_agent.profile import api as profile_api

    diagnosis = await in_thread(lambda: profile_api.diagnose(directory, chip=chip))
    items = [_item_from_finding(f.to_dict(), ws) for f in diagnosis.findings]
    return models.DiagnoseResult(
        logdir=ws.relative(directory),
        chip=diagnosis.model.config.chip.key,
        findings=items[:max_items],
        truncated=len(items) > max_items,
        report=profile_api.render(diagnosis, "markdown")[:60_000],
        next_action=(
            "Apply each finding's agent_diff where diff_verified is true (profile ran it on a copy); make the other "
            "changes by hand from suggested_change, then tpu_profile again and compare."
            if items
            else "No findings: the step is not limited by anything the rules detect."
        ),
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        tpu_diagnose,
        "tpu_diagnose",
        "Diagnose a profile: what limits the TPU step (host syncs, recompiles, eager flushes, fallbacks, input "
        "pipeline, precision, memory), each finding with its source location and the suggested change. Pass "
        "the job_id of a finished tpu_profile job, or a logdir; default: the newest profile in the workspace.",
        tool_hints("Diagnose a TPU profile", read_only=True),
    ),
)

__all__ = ["TOOLS", "tpu_diagnose"]
