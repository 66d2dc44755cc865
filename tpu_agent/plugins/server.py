"""``tpu-agent mcp``: the MCP server that exposes migrate, run, profile and diagnose to coding agents.

Built on the official ``mcp`` SDK 2.x (``MCPServer``). This module only assembles the server: the tools live
in :mod:`tpu_agent.plugins.tools` (one module per area, each tool a thin wrapper over a public API), the
resources and prompts beside them. Tools take workspace-relative paths, return pydantic models (published
output schemas, structured content), refuse unknown or oversized arguments, and fail with
``TpuAgentError``'s code, message and hint so an agent knows what to do next. The heavy APIs are imported
inside the tools, so the server answers ``tools/list`` without importing torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from mcp.server.mcpserver import MCPServer

from tpu_agent import __version__
from tpu_agent.plugins.install import SERVER_NAME
from tpu_agent.plugins.jobs import JobManager
from tpu_agent.plugins.limits import DEFAULT_MAX_JOBS, DEFAULT_MAX_RANKS
from tpu_agent.plugins.tools import check, diagnose, doctor, jobs, migrate, resources
from tpu_agent.plugins.tools.args import MAX_WAIT_S
from tpu_agent.plugins.tools.common import ServerState, format_error

#: The tool modules, in the order ``tools/list`` shows them (doctor first: agents are told to call it first).
TOOL_MODULES = (doctor, migrate, jobs, check, diagnose)

INSTRUCTIONS = """\
tpu-agent moves CUDA PyTorch code onto Google TPUs (TorchTPU) and tunes it.
Workflow: tpu_scan -> tpu_plan_migration (shows a unified diff, touches nothing) -> show the diff to the
user and wait for approval -> tpu_apply_plan -> tpu_run (a job; poll tpu_job_status) -> tpu_profile ->
tpu_diagnose -> edit the code per each finding's suggested_change -> run/profile again.
Paths are relative to the workspace (the project directory). If a tool says no-workspace, pass
workspace='/abs/path/to/repo'. Errors start with a stable code and end with a hint saying what to do.
"""


def build_server(
    workspace: str | None = None,
    *,
    log_level: str = "WARNING",
    max_jobs: int = DEFAULT_MAX_JOBS,
    max_ranks: int = DEFAULT_MAX_RANKS,
) -> MCPServer[ServerState]:
    """The ``tpu-agent`` MCP server; ``workspace`` is the ``--workspace`` every call stays inside.

    ``max_jobs`` bounds the jobs running at once, ``max_ranks`` the processes one job may start.
    """
    state = ServerState(configured_workspace=workspace, max_ranks=max_ranks, jobs=JobManager(max_jobs))

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer[ServerState]) -> AsyncIterator[ServerState]:
        try:
            yield state
        finally:
            state.jobs.shutdown()

    server: MCPServer[ServerState] = MCPServer(
        SERVER_NAME,
        title="tpu-agent",
        description="Move CUDA PyTorch code onto Google TPUs through TorchTPU, then run, profile and tune it.",
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level=log_level,  # type: ignore[arg-type]  # the CLI's LogLevel choices are the SDK's literals
        lifespan=lifespan,
        tools=[spec.build() for module in TOOL_MODULES for spec in module.TOOLS],
    )
    resources.register(server)
    return server


def serve(
    workspace: str | None,
    transport: str = "stdio",
    port: int = 8765,
    log_level: str = "WARNING",
    max_jobs: int = DEFAULT_MAX_JOBS,
    max_ranks: int = DEFAULT_MAX_RANKS,
) -> None:
    """Run the server until the host disconnects; jobs still running are killed on the way out (the lifespan
    does that on a clean exit, each job's guard when the server dies)."""
    server = build_server(workspace, log_level=log_level, max_jobs=max_jobs, max_ranks=max_ranks)
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)


__all__ = ["MAX_WAIT_S", "SERVER_NAME", "TOOL_MODULES", "ServerState", "build_server", "format_error", "serve"]
