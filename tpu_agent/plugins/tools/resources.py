"""The server's resources (the rule catalogue, a plan's diff, a job's log) and prompts (the two workflows).

Plan and job ids in resource URIs are checked like the tools' arguments: a plan id is looked up only in the
workspace the server was started with, a job id only among this server's jobs, and neither is echoed whole.
"""

from __future__ import annotations

import json

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError

from tpu_agent.errors import TpuAgentError
from tpu_agent.plugins.bundles import load_skill_body
from tpu_agent.plugins.plans import load_plan
from tpu_agent.plugins.tools.common import URI_SCHEME, format_error, server_state
from tpu_agent.plugins.workspace import resolve_workspace


def rules_catalogue() -> str:
    from tpu_agent.migrate.rules import ALL_RULES

    return json.dumps([rule.to_dict() for _, rule in sorted(ALL_RULES.items())], indent=1)


def plan_diff(plan_id: str, ctx: Context) -> str:
    try:
        return load_plan(plan_id, resolve_workspace(None, server_state(ctx).configured_workspace)).diff
    except TpuAgentError as error:
        raise ResourceError(format_error(error)) from error


def job_log(job_id: str, ctx: Context) -> str:
    try:
        return "\n".join(server_state(ctx).jobs.get(job_id).log_tail(200)) + "\n"
    except TpuAgentError as error:
        raise ResourceError(format_error(error)) from error


def migrate_to_tpu(path: str = ".") -> str:
    return f"Migrate `{path[:200]}` in this workspace from CUDA to TPU.\n\n" + load_skill_body("tpu-migrate")


def why_is_my_tpu_step_slow(entrypoint: str = "train.py") -> str:
    return f"Find out why the TPU step of `{entrypoint[:200]}` is slow and fix it.\n\n" + load_skill_body("tpu-tune")


def register(server: MCPServer) -> None:
    """Add the resources and prompts to ``server``."""
    server.resource(
        f"{URI_SCHEME}://rules", name="rules", mime_type="application/json", description="Every migration rule."
    )(rules_catalogue)
    server.resource(
        f"{URI_SCHEME}://plans/{{plan_id}}/diff",
        name="plan-diff",
        mime_type="text/x-diff",
        description="A plan's diff.",
    )(plan_diff)
    server.resource(
        f"{URI_SCHEME}://jobs/{{job_id}}/log",
        name="job-log",
        mime_type="text/plain",
        description="A job's log (last 200 lines).",
    )(job_log)
    server.prompt(
        name="migrate_to_tpu", title="Migrate this repo to TPU", description="Scan, plan, review, apply, run."
    )(migrate_to_tpu)
    server.prompt(
        name="why_is_my_tpu_step_slow", title="Why is my TPU step slow?", description="Profile, diagnose, fix."
    )(why_is_my_tpu_step_slow)


__all__ = ["register"]
