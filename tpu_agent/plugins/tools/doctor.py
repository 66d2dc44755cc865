"""The doctor tool: what an agent checks first. It never fails: every problem is a listed item with a hint."""

from __future__ import annotations

import platform
import shutil
import sys
from typing import Any

from mcp.server.mcpserver import Context

from tpu_agent import __version__
from tpu_agent.errors import TpuAgentError
from tpu_agent.plugins import models
from tpu_agent.plugins.tools.args import WorkspaceArg
from tpu_agent.plugins.tools.common import ToolSpec, in_thread, logger, server_state, tool_hints
from tpu_agent.plugins.workspace import Workspace


def _problem(error: Exception) -> models.Problem:
    if isinstance(error, TpuAgentError):
        return models.Problem(**error.to_dict())
    logger.exception("tpu_doctor check crashed")
    return models.Problem(
        code="internal-error",
        message=f"{type(error).__name__}: {str(error)[:500]}",
        hint="This is a tpu-agent bug; the server's stderr has the traceback.",
    )


async def tpu_doctor(ctx: Context, workspace: WorkspaceArg = None) -> models.DoctorResult:
    problems: list[models.Problem] = []
    state = server_state(ctx)
    ws: Workspace | None = None
    try:
        ws = await state.workspace(ctx, workspace)
    except Exception as error:  # noqa: BLE001 - the doctor reports every failure, it does not fail
        problems.append(_problem(error))
    runtime: dict[str, Any] = {}
    try:
        from tpu_agent.runtime import api as runtime_api

        runtime = (await in_thread(runtime_api.doctor)).to_dict()
    except Exception as error:  # noqa: BLE001 - as above: a broken runtime is the doctor's finding
        problems.append(_problem(error))
    if shutil.which("tpu-agent") is None:
        problems.append(
            models.Problem(
                code="cli-not-on-path",
                message="the tpu-agent command is not on PATH",
                hint=f'Install it where your host looks: pip install "tpu-agent=={__version__}".',
            )
        )
    return models.DoctorResult(
        tpu_agent_version=__version__,
        python=f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        workspace=str(ws.root) if ws else None,
        workspace_source=ws.source if ws else None,
        runtime=runtime,
        limits={"max_jobs": state.jobs.max_running, "max_ranks": state.max_ranks},
        problems=problems,
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        tpu_doctor,
        "tpu_doctor",
        "Check the environment: tpu-agent and Python versions, the workspace the tools will use (and where it "
        "came from), and the runtime's backend choice (real torch_tpu or the CPU emulation). Call it first; "
        "it never fails, it lists problems with hints instead.",
        tool_hints("Check the TPU environment", read_only=True),
    ),
)

__all__ = ["TOOLS", "tpu_doctor"]
