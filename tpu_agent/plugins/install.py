"""``tpu-agent plugin install|print-config``: register the MCP server in a harness's own config file.

For hosts without a plugin system we target (Windsurf, Zed) and for users who prefer a plain MCP entry.
Each harness is one :class:`Harness` row (file per scope, top-level key, entry shape, how the host
names the project directory); one merge function serves them all. The merge adds or updates only our
server entry, leaves every other server and setting alone, is a no-op when the entry is already there,
and writes atomically. Codex's TOML goes through tomlkit so comments survive; a JSON file with comments
(VS Code and Zed allow them) is refused with the snippet to paste, because rewriting it would drop them.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.fsutil import atomic_write_text

Scope = Literal["project", "user"]
#: The name the server registers under in every host's config, and the name it gives itself in the handshake.
SERVER_NAME = "tpu-agent"


@dataclass(frozen=True)
class Harness:
    """How one host registers a stdio MCP server."""

    name: str
    title: str
    project_file: str | None  # relative to the project; None: the host has no project-level file
    user_file: Callable[[Path], Path] | None  # from the home directory
    key: str  # top-level key holding the servers
    format: Literal["json", "toml"]
    typed: bool  # entry carries "type": "stdio"
    extra: tuple[tuple[str, Any], ...] = ()  # fixed fields the host wants, e.g. Zed's source = custom
    workspace_var: str | None = None  # a variable the host expands to the project directory
    sets_project_env: bool = False  # the host sets CLAUDE_PROJECT_DIR for servers it starts


# Gemini CLI's `gemini mcp list` gives a server 5 s to start and answer unless its entry names a `timeout`; a
# Python server's first start on a busy machine can take longer, and is then listed "Disconnected". Its own
# default request timeout (10 minutes) named explicitly keeps tool calls' limit and covers the start.
GEMINI_ENTRY_FIELDS: tuple[tuple[str, Any], ...] = (("timeout", 600_000),)


def _vscode_user_file(home: Path) -> Path:
    if sys.platform == "darwin":
        return home / "Library/Application Support/Code/User/mcp.json"
    return home / ".config/Code/User/mcp.json"


HARNESSES: dict[str, Harness] = {
    h.name: h
    for h in (
        Harness(
            "claude-code",
            "Claude Code",
            ".mcp.json",
            lambda home: home / ".claude.json",
            "mcpServers",
            "json",
            typed=True,
            sets_project_env=True,
        ),
        Harness(
            "gemini",
            "Gemini CLI",
            ".gemini/settings.json",
            lambda home: home / ".gemini/settings.json",
            "mcpServers",
            "json",
            typed=False,
            extra=GEMINI_ENTRY_FIELDS,
        ),
        Harness(
            "codex",
            "Codex CLI",
            ".codex/config.toml",
            lambda home: home / ".codex/config.toml",
            "mcp_servers",
            "toml",
            typed=False,
        ),
        Harness(
            "cursor",
            "Cursor",
            ".cursor/mcp.json",
            lambda home: home / ".cursor/mcp.json",
            "mcpServers",
            "json",
            typed=False,
            workspace_var="${workspaceFolder}",
        ),
        Harness(
            "vscode",
            "VS Code (Copilot agent mode)",
            ".vscode/mcp.json",
            _vscode_user_file,
            "servers",
            "json",
            typed=True,
            workspace_var="${workspaceFolder}",
        ),
        Harness(
            "windsurf",
            "Windsurf",
            None,
            lambda home: home / ".codeium/windsurf/mcp_config.json",
            "mcpServers",
            "json",
            typed=False,
        ),
        Harness(
            "zed",
            "Zed",
            ".zed/settings.json",
            lambda home: home / ".config/zed/settings.json",
            "context_servers",
            "json",
            typed=False,
            extra=(("source", "custom"),),
        ),
    )
}


def get_harness(name: str) -> Harness:
    try:
        return HARNESSES[name]
    except KeyError:
        raise TpuAgentError(
            "unknown-harness", f"unknown harness {name!r}", f"Choose one of: {', '.join(HARNESSES)}."
        ) from None


def server_command() -> list[str]:
    """The absolute command a host should start: hosts launched from a dock have a minimal PATH."""
    found = shutil.which("tpu-agent")
    return [str(Path(found).resolve())] if found else [sys.executable, "-m", "tpu_agent"]


def config_path(harness: Harness, scope: Scope, project: Path, home: Path) -> Path:
    if scope == "project":
        if harness.project_file is None:
            raise TpuAgentError(
                "no-project-scope",
                f"{harness.title} has no project-level MCP file",
                "Use --scope user (the entry then carries --workspace with the project's absolute path).",
            )
        return project / harness.project_file
    assert harness.user_file is not None
    return harness.user_file(home)


def server_entry(harness: Harness, scope: Scope, project: Path, command: list[str] | None = None) -> dict[str, Any]:
    """Our entry for ``harness``: the command plus a workspace the server can trust.

    Hosts with a project variable get it (VS Code and Cursor expand ``${workspaceFolder}``); Claude Code
    sets ``CLAUDE_PROJECT_DIR`` itself; the rest get the project's absolute path for project scope, and
    no workspace for user scope (the tools then take a ``workspace`` argument).
    """
    argv = list(command or server_command()) + ["mcp"]
    if harness.workspace_var:
        argv += ["--workspace", harness.workspace_var]
    elif scope == "project" and not harness.sets_project_env:
        argv += ["--workspace", str(project.resolve())]
    entry: dict[str, Any] = {"type": "stdio"} if harness.typed else {}
    entry.update(harness.extra)
    entry["command"] = argv[0]
    entry["args"] = argv[1:]
    return entry


@dataclass(frozen=True)
class InstallResult:
    harness: str
    scope: Scope
    path: Path
    changed: bool
    written: bool
    diff: str
    entry: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "harness": self.harness,
            "scope": self.scope,
            "path": str(self.path),
            "changed": self.changed,
            "written": self.written,
            "diff": self.diff,
            "entry": self.entry,
        }


def _merge_json(text: str, path: Path, harness: Harness, entry: dict[str, Any]) -> str:
    if text.strip():
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            snippet = json.dumps({harness.key: {SERVER_NAME: entry}}, indent=2)
            raise TpuAgentError(
                "config-not-plain-json",
                f"{path} is not plain JSON (line {error.lineno}: {error.msg}); comments or trailing commas "
                "would be lost by rewriting it",
                f"Add this entry by hand under {harness.key!r}:\n{snippet}",
                ExitCode.REFUSED,
            ) from None
        if not isinstance(data, dict):
            raise TpuAgentError(
                "config-not-object",
                f"{path} does not hold a JSON object",
                "Fix the file or move it away.",
                ExitCode.REFUSED,
            )
    else:
        data = {}
    servers = data.setdefault(harness.key, {})
    if not isinstance(servers, dict):
        raise TpuAgentError(
            "config-bad-key", f"{path}: {harness.key!r} is not an object", "Fix the file.", ExitCode.REFUSED
        )
    servers[SERVER_NAME] = entry
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _merge_toml(text: str, path: Path, harness: Harness, entry: dict[str, Any]) -> str:
    import tomlkit  # here, not at the top: every CLI command imports this module for its harness names
    import tomlkit.exceptions

    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as error:
        raise TpuAgentError(
            "config-not-toml", f"{path} is not valid TOML ({error})", "Fix the file first.", ExitCode.REFUSED
        ) from None
    servers = doc.get(harness.key)
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        doc[harness.key] = servers
    table = tomlkit.table()
    for key, value in entry.items():
        table[key] = value
    servers[SERVER_NAME] = table
    return tomlkit.dumps(doc)


def _entry_in(text: str, harness: Harness) -> Any:
    """Our current entry in the file's text, or None."""
    if not text.strip():
        return None
    import tomlkit
    import tomlkit.exceptions

    try:
        data = tomlkit.parse(text).unwrap() if harness.format == "toml" else json.loads(text)
    except (ValueError, tomlkit.exceptions.ParseError):
        return None
    servers = data.get(harness.key) if isinstance(data, dict) else None
    return servers.get(SERVER_NAME) if isinstance(servers, dict) else None


def install(
    harness_name: str,
    scope: Scope = "project",
    *,
    project: Path | None = None,
    home: Path | None = None,
    dry_run: bool = False,
    command: list[str] | None = None,
) -> InstallResult:
    """Merge our server entry into the harness's config file (see the module docstring)."""
    harness = get_harness(harness_name)
    project = (project or Path.cwd()).resolve()
    home = home or Path.home()
    path = config_path(harness, scope, project, home)
    entry = server_entry(harness, scope, project, command)
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    if _entry_in(before, harness) == entry:
        return InstallResult(harness.name, scope, path, changed=False, written=False, diff="", entry=entry)
    merge = _merge_toml if harness.format == "toml" else _merge_json
    after = merge(before, path, harness, entry)
    import difflib  # here, like tomlkit: only an install needs it

    diff = "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=str(path), tofile=str(path)
        )
    )
    if not dry_run:
        atomic_write_text(path, after)
    return InstallResult(harness.name, scope, path, changed=True, written=not dry_run, diff=diff, entry=entry)


def print_config(
    harness_name: str,
    scope: Scope = "project",
    *,
    project: Path | None = None,
    home: Path | None = None,
    command: list[str] | None = None,
) -> tuple[Path, str]:
    """The file ``install`` would edit and the minimal content that registers the server there."""
    harness = get_harness(harness_name)
    project = (project or Path.cwd()).resolve()
    path = config_path(harness, scope, project, home or Path.home())
    merge = _merge_toml if harness.format == "toml" else _merge_json
    return path, merge("", path, harness, server_entry(harness, scope, project, command))


__all__ = [
    "HARNESSES",
    "Harness",
    "InstallResult",
    "config_path",
    "get_harness",
    "install",
    "print_config",
    "server_entry",
]
