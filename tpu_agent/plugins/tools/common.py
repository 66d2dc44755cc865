"""What every MCP tool module shares: the server's state, how a tool is declared, and how it fails.

A tool is a module-level ``async`` function plus a :class:`ToolSpec` record (name, description, annotations);
``tpu_agent.plugins.server`` turns the records into SDK tools with :meth:`ToolSpec.build`. Built tools are
:class:`ClosedTool`: their input schema says ``additionalProperties: false`` and a call with an unknown,
misspelt, oversized or mistyped argument is refused as ``invalid-argument`` before the tool runs (the SDK
alone would ignore a misspelt argument and run on the defaults). A :class:`TpuAgentError` raised by a tool
reaches the agent as its code, message and hint; anything else is reported as ``internal-error``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlparse
from urllib.request import url2pathname

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, ValidationError

from tpu_agent.errors import ECHO_CHARS, ExitCode, TpuAgentError, clipped
from tpu_agent.plugins.jobs import JobManager
from tpu_agent.plugins.limits import DEFAULT_MAX_JOBS, DEFAULT_MAX_RANKS
from tpu_agent.plugins.workspace import Workspace, configured_workspace, resolve_workspace

logger = logging.getLogger("tpu_agent.mcp")

URI_SCHEME = "tpu-agent"

T = TypeVar("T")


@dataclass
class ServerState:
    """What one server process holds: the workspace it was started with, its limits, and the jobs it started."""

    configured_workspace: str | None
    max_ranks: int = DEFAULT_MAX_RANKS
    jobs: JobManager = field(default_factory=lambda: JobManager(DEFAULT_MAX_JOBS))

    async def workspace(self, ctx: Context, argument: str | None) -> Workspace:
        """The workspace for one call; when nothing names it, the client's MCP roots as a last resort.

        Roots exist only on handshake-era (2025-11-25) connections whose client advertises them (VS Code,
        Cursor and Copilot load Agent Plugins with the plugin directory as cwd and no project variable).
        They are then the boundary that a fixed workspace would otherwise be: a ``workspace`` argument must
        name one of them or a directory inside one.
        """
        try:
            chosen = resolve_workspace(argument, self.configured_workspace)
        except TpuAgentError as error:
            if error.code != "no-workspace":
                raise
            roots = await _client_roots(ctx)
            if not roots:
                raise
            return dataclasses.replace(resolve_workspace(roots[0], None), source="roots")
        if chosen.source == "argument" and configured_workspace(self.configured_workspace) is None:
            roots = [os.path.realpath(root) for root in await _client_roots(ctx)]
            if roots and not any(chosen.root.is_relative_to(root) for root in roots):
                raise TpuAgentError(
                    "workspace-outside-roots",
                    f"the workspace argument {clipped(str(argument))} is outside the roots this client shared "
                    f"({', '.join(clipped(root) for root in roots[:3])})",
                    "Omit workspace (the tools then use the first root) or pass a directory inside a root.",
                    ExitCode.REFUSED,
                )
        return chosen


def server_state(ctx: Context) -> ServerState:
    """The :class:`ServerState` the server's lifespan hands every request."""
    state = ctx.request_context.lifespan_context
    assert isinstance(state, ServerState), state
    return state


async def _client_roots(ctx: Context) -> list[str]:
    """The ``file://`` roots the client lists, in its order; none when it has no roots (or no back-channel)."""
    capabilities = ctx.client_capabilities
    if capabilities is None or capabilities.roots is None:
        return []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            result = await ctx.session.list_roots()
    except MCPError as error:  # NoBackChannelError on 2026 connections, or the client refused
        logger.info("roots/list failed: %r", error)
        return []
    uris = (str(root.uri) for root in result.roots)
    return [url2pathname(urlparse(uri).path) for uri in uris if uri.startswith("file://")]


def format_error(error: TpuAgentError) -> str:
    """What the agent reads for a refused call: code, what happened, what to do, and a JSON copy."""
    text = f"{error.code}: {error.message}"
    if error.hint:
        text += f"\nHint: {error.hint}"
    return text + "\n" + json.dumps({"error": error.to_dict()})


def invalid_argument(tool: str, error: ValidationError) -> TpuAgentError:
    """The arguments the schema refused, by name and reason; never the values, which may be huge."""
    problems = []
    for item in error.errors(include_input=False, include_url=False)[:5]:
        where = ".".join(str(part) for part in item["loc"])[:ECHO_CHARS] or "arguments"
        reason = "not an argument of this tool" if item["type"] == "extra_forbidden" else item["msg"][:300]
        problems.append(f"{where}: {reason}")
    more = f" (and {error.error_count() - 5} more)" if error.error_count() > 5 else ""
    return TpuAgentError(
        "invalid-argument",
        f"{tool}: " + "; ".join(problems) + more,
        "Fix the named arguments; the tool's input schema (tools/list) gives every argument's type and limits, "
        "and arguments it does not list are refused.",
    )


def tool_errors(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Turn :class:`TpuAgentError` (and crashes in the wrapped APIs) into ``is_error`` tool results."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except TpuAgentError as error:
            raise ToolError(format_error(error)) from error
        except (ToolError, ResourceError):
            raise
        except Exception as error:  # a bug below us: tell the agent what broke instead of a bare failure
            logger.exception("tool %s crashed", fn.__name__)
            internal = TpuAgentError(
                "internal-error",
                f"{type(error).__name__}: {str(error)[:500]}",
                "This is a tpu-agent bug; the server's stderr has the traceback. Retrying will not help.",
                ExitCode.INTERNAL,
            )
            raise ToolError(format_error(internal)) from error

    return wrapper


class ClosedTool(Tool):
    """An SDK tool whose arguments are a closed set: unknown ones are refused, every refusal is
    ``invalid-argument`` in the same format as the tools' own errors."""

    @classmethod
    def close(cls, tool: Tool) -> ClosedTool:
        model = tool.fn_metadata.arg_model
        closed: type[BaseModel] = type(
            model.__name__, (model,), {"model_config": ConfigDict(extra="forbid"), "__module__": __name__}
        )
        metadata = tool.fn_metadata.model_copy(update={"arg_model": closed})
        return cls(**{**dict(tool), "fn_metadata": metadata, "parameters": closed.model_json_schema(by_alias=True)})

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        try:
            return await super().run(arguments, context, convert_result=convert_result)
        except ToolError as error:
            if isinstance(error.__cause__, ValidationError) and type(error) is ToolError:
                raise ToolError(format_error(invalid_argument(self.name, error.__cause__))) from None
            raise


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool as data: the function and what the host shows about it."""

    fn: Callable[..., Awaitable[Any]]
    name: str
    description: str
    annotations: ToolAnnotations

    def build(self) -> ClosedTool:
        tool = Tool.from_function(
            tool_errors(self.fn), name=self.name, description=self.description, annotations=self.annotations
        )
        return ClosedTool.close(tool)


def tool_hints(title: str, *, read_only: bool, destructive: bool = False, idempotent: bool = True) -> ToolAnnotations:
    """A tool's hints for the host; no tool reaches outside the workspace (``open_world_hint`` is always False)."""
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=False,
    )


async def in_thread(func: Callable[[], T]) -> T:
    return await anyio.to_thread.run_sync(func)


def progress_relay(ctx: Context) -> Callable[[int, int], None]:
    """A sync ``progress(done, total)`` for the APIs, forwarding increasing values as MCP progress."""
    last = [-1]

    def relay(done: int, total: int) -> None:
        if done <= last[0]:
            return
        last[0] = done
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
            anyio.from_thread.run(ctx.report_progress, float(done), float(total), f"{done}/{total} files")

    return relay


__all__ = [
    "URI_SCHEME",
    "ClosedTool",
    "ServerState",
    "ToolSpec",
    "format_error",
    "in_thread",
    "invalid_argument",
    "progress_relay",
    "server_state",
    "tool_errors",
    "tool_hints",
]
