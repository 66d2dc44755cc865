"""CLI commands of ``tpu_agent.plugins``: argument parsing and rendering only.

``tpu-agent mcp`` serves the MCP tools; ``tpu-agent plugin build|install|print-config`` produce the
plugin directory and per-harness config entries.
"""

from __future__ import annotations

import signal
import sys
from enum import Enum
from pathlib import Path
from typing import get_args

import typer

from tpu_agent.cli._output import FORMAT_HELP, OutputFormat, console, console_err, handles_errors, print_json
from tpu_agent.plugins.install import HARNESSES, Scope
from tpu_agent.plugins.limits import DEFAULT_MAX_JOBS, DEFAULT_MAX_RANKS, MAX_RANKS


class Transport(str, Enum):
    stdio = "stdio"
    streamable_http = "streamable-http"


# The harness and scope choices come from the installer's own tables, so a harness added there is offered here.
HarnessName = Enum("HarnessName", {name.replace("-", "_"): name for name in HARNESSES}, type=str)  # type: ignore[misc]  # functional Enum: members come from HARNESSES
ScopeName = Enum("ScopeName", {name: name for name in get_args(Scope)}, type=str)  # type: ignore[misc]  # members come from Scope


class LogLevel(str, Enum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


plugin_app = typer.Typer(
    name="plugin",
    help=(
        "Build the coding-agent plugin and register the MCP server with a harness.\n\n"
        "Examples:\n\n"
        "  tpu-agent plugin build --check\n\n"
        "  tpu-agent plugin install --harness codex --scope user --dry-run\n\n"
        "  tpu-agent plugin print-config --harness vscode"
    ),
    no_args_is_help=True,
)


@handles_errors
def mcp_command(
    transport: Transport = typer.Option(
        Transport.stdio, "--transport", help="stdio (what hosts start) or streamable-http."
    ),
    port: int = typer.Option(8765, "--port", min=1, max=65535, help="HTTP port; the server binds 127.0.0.1 only."),
    workspace: str = typer.Option(
        None, "--workspace", help="Absolute project directory (default: the tool argument or CLAUDE_PROJECT_DIR)."
    ),
    log_level: LogLevel = typer.Option(LogLevel.WARNING, "--log-level", help="Server log level (logs go to stderr)."),
    max_jobs: int = typer.Option(
        DEFAULT_MAX_JOBS, "--max-jobs", min=1, max=64, help="Jobs (runs, profiles) running at once; more are refused."
    ),
    max_ranks: int = typer.Option(
        DEFAULT_MAX_RANKS, "--max-ranks", min=1, max=MAX_RANKS, help="Processes (ranks) one job may start."
    ),
) -> None:
    """Serve the tpu-agent MCP tools to a coding agent (stdout carries only the protocol).

    Examples:

      tpu-agent mcp --workspace /home/me/repo

      tpu-agent mcp --transport streamable-http --port 8765

      tpu-agent mcp --workspace /home/me/repo --max-jobs 1 --max-ranks 4

    With --workspace, no tool call reaches outside that directory.
    """
    from tpu_agent.plugins.server import serve
    from tpu_agent.plugins.workspace import resolve_workspace

    if workspace is not None:
        workspace = str(resolve_workspace(None, workspace).root)
    # A host stops a server with SIGTERM: exit through Python so running jobs are killed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(
        workspace,
        transport=transport.value,
        port=port,
        log_level=log_level.value,
        max_jobs=max_jobs,
        max_ranks=max_ranks,
    )


@plugin_app.command("build")
@handles_errors
def build_command(
    out: Path = typer.Option(Path("plugin"), "--out", help="The plugin directory to write."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when OUT differs from a fresh build."),
    output_format: OutputFormat = typer.Option(OutputFormat.text, "--format", help=FORMAT_HELP),
) -> None:
    """Render the plugin directory (Claude Code, Agent Plugins, Gemini CLI) from its one canonical source.

    Examples:

      tpu-agent plugin build

      tpu-agent plugin build --check --format json
    """
    from tpu_agent.plugins.build import check_bundle, write_bundle

    diff = check_bundle(out) if check else write_bundle(out)
    if output_format == OutputFormat.json:
        print_json({"out": str(out), "check": check, "clean": diff.clean, **diff.to_dict()})
    else:
        for label, paths in (("missing", diff.missing), ("changed", diff.changed), ("extra", diff.extra)):
            for path in paths:
                console.print(
                    f"{'would fix' if check else 'wrote' if label != 'extra' else 'removed'} "
                    f"[bold]{label}[/] {out / path}",
                    highlight=False,
                )
        if diff.clean:
            console.print(f"{out} is up to date", highlight=False)
    if check and not diff.clean:
        if output_format != OutputFormat.json:
            console_err.print("the plugin directory is stale: run [bold]tpu-agent plugin build[/]")
        raise typer.Exit(1)


@plugin_app.command("install")
@handles_errors
def install_command(
    harness: HarnessName = typer.Option(..., "--harness", help="Which host's config to edit."),
    scope: ScopeName = typer.Option(
        ScopeName("project"), "--scope", help="project: the repo's file; user: your home's."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the diff, write nothing."),
    project: Path = typer.Option(Path("."), "--project", help="The project directory (project scope)."),
    output_format: OutputFormat = typer.Option(OutputFormat.text, "--format", help=FORMAT_HELP),
) -> None:
    """Add the tpu-agent MCP server to a harness's config, keeping every other server (idempotent).

    Examples:

      tpu-agent plugin install --harness cursor

      tpu-agent plugin install --harness codex --scope user --dry-run
    """
    from tpu_agent.plugins.install import install

    result = install(harness.value, scope.value, project=project, dry_run=dry_run)
    if output_format == OutputFormat.json:
        print_json({"dry_run": dry_run, **result.to_dict()})
        return
    if result.diff:
        sys.stdout.write(result.diff)
    if not result.changed:
        console.print(f"{result.path} already registers tpu-agent; nothing to do", highlight=False)
    elif dry_run:
        console_err.print(f"dry run: {result.path} not written", highlight=False)
    else:
        console.print(f"registered tpu-agent in {result.path}", highlight=False)


@plugin_app.command("print-config")
@handles_errors
def print_config_command(
    harness: HarnessName = typer.Option(..., "--harness", help="Which host's config to print."),
    scope: ScopeName = typer.Option(ScopeName("project"), "--scope", help="project or user."),
    project: Path = typer.Option(Path("."), "--project", help="The project directory (project scope)."),
    output_format: OutputFormat = typer.Option(OutputFormat.text, "--format", help=FORMAT_HELP),
) -> None:
    """Print the minimal config that registers the server with a harness, and the file it belongs in.

    Examples:

      tpu-agent plugin print-config --harness claude-code

      tpu-agent plugin print-config --harness zed --scope user --format json
    """
    from tpu_agent.plugins.install import print_config

    path, content = print_config(harness.value, scope.value, project=project)
    if output_format == OutputFormat.json:
        print_json({"harness": harness.value, "scope": scope.value, "path": str(path), "content": content})
    else:
        console_err.print(f"# {path}", highlight=False)
        sys.stdout.write(content)


def register(app: typer.Typer) -> None:
    """Add this group's commands to the root app."""
    app.command("mcp")(mcp_command)
    app.add_typer(plugin_app, name="plugin")
