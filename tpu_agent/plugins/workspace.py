"""The workspace an agent works in, resolved explicitly, and the sandbox every tool path goes through.

A coding agent's host starts ``tpu-agent mcp`` from wherever suits it: Claude Code uses the project
directory, Codex and the Agent Plugins spec use the plugin's own cache directory. So the server never
takes its working directory as the user's repository. The workspace comes from, in order: the tool
call's ``workspace`` argument, ``--workspace`` (or ``TPU_AGENT_WORKSPACE``), the harness's project
variable (``CLAUDE_PROJECT_DIR``, which Claude Code sets for the servers it starts), and, on connections
that have them, the client's MCP roots (see ``tpu_agent.plugins.server``); with none of these the call is
refused.

Every path a tool receives is resolved (symlinks included) and must stay inside the workspace; nothing
is ever written under ``.git/``, and the server's own artefacts (plans, job logs, profiles) live under
``<workspace>/.tpu-agent/``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.fsutil import atomic_write_text

#: Environment variables that name the project directory, first match wins. ``TPU_AGENT_WORKSPACE`` is
#: ours (for hosts that cannot pass arguments); ``CLAUDE_PROJECT_DIR`` is set by Claude Code.
WORKSPACE_ENV_VARS: tuple[str, ...] = ("TPU_AGENT_WORKSPACE", "CLAUDE_PROJECT_DIR")

ARTEFACT_DIR = ".tpu-agent"


@dataclass(frozen=True)
class Workspace:
    """A resolved, existing project directory and where its answer came from (reported by ``tpu_doctor``)."""

    root: Path  # absolute, symlinks resolved
    source: str  # "argument", "--workspace", or the environment variable's name

    @property
    def artefacts(self) -> Path:
        return self.root / ARTEFACT_DIR

    def artefact_dir(self, *parts: str) -> Path:
        """``<workspace>/.tpu-agent/<parts>``, created on demand.

        The directory ignores itself (``.tpu-agent/.gitignore``), so plans, logs and profiles never show
        up as changes in the user's repository.
        """
        path = self.artefacts.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        ignore = self.artefacts / ".gitignore"
        if not ignore.exists():
            atomic_write_text(ignore, "# tpu-agent's plans, job logs and profiles\n*\n")
        return path

    def resolve(self, user_path: str | os.PathLike[str], *, must_exist: bool = True, for_write: bool = False) -> Path:
        """Resolve ``user_path`` (relative to the workspace, or absolute inside it) and refuse escapes.

        Symlinks are followed before the check, so a link that points out of the workspace is refused
        like ``../``. ``for_write`` also refuses anything under ``.git/``.
        """
        raw = str(user_path)
        if "\x00" in raw:
            raise TpuAgentError("invalid-path", f"path {raw!r} contains a NUL byte", "Pass a plain relative path.")
        candidate = Path(raw).expanduser()
        joined = candidate if candidate.is_absolute() else self.root / candidate
        resolved = Path(os.path.realpath(joined))
        if not resolved.is_relative_to(self.root):
            raise TpuAgentError(
                "path-outside-workspace",
                f"path {raw!r} resolves to {resolved}, which is outside the workspace {self.root}",
                "Pass a path relative to the workspace (for example 'train.py' or '.'), or pass "
                "workspace='/abs/path/to/repo' if the project lives elsewhere.",
                ExitCode.REFUSED,
            )
        if for_write and ".git" in resolved.relative_to(self.root).parts:
            raise TpuAgentError(
                "path-in-git-dir",
                f"path {raw!r} is inside .git/, which tpu-agent never writes",
                "Choose a path in the working tree.",
                ExitCode.REFUSED,
            )
        if must_exist and not resolved.exists():
            raise TpuAgentError(
                "path-not-found",
                f"path {raw!r} does not exist in the workspace {self.root}",
                "Call tpu_scan with paths=['.'] to see the project's files, then pass one of them.",
            )
        return resolved

    def relative(self, path: Path) -> str:
        """The workspace-relative POSIX spelling of ``path`` (what tools return to agents)."""
        resolved = Path(os.path.realpath(path))
        try:
            rel = resolved.relative_to(self.root)
        except ValueError:
            return str(resolved)
        return rel.as_posix() or "."


def _as_workspace(raw: str, source: str) -> Workspace:
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise TpuAgentError(
            "workspace-not-absolute",
            f"the workspace {raw!r} (from {source}) is not an absolute path",
            "Pass the project's absolute path, e.g. workspace='/home/me/repo'.",
        )
    root = Path(os.path.realpath(path))
    if not root.is_dir():
        raise TpuAgentError(
            "workspace-not-found",
            f"the workspace {raw!r} (from {source}) is not an existing directory",
            "Pass the absolute path of the project directory.",
        )
    if root == Path(root.anchor):
        raise TpuAgentError(
            "workspace-too-broad",
            f"the workspace {raw!r} (from {source}) is the filesystem root",
            "Pass the project directory itself, not '/'.",
            ExitCode.REFUSED,
        )
    return Workspace(root=root, source=source)


def resolve_workspace(
    argument: str | None, configured: str | None, environ: Mapping[str, str] | None = None
) -> Workspace:
    """Pick the workspace for one tool call: the argument, else ``--workspace``, else a harness variable.

    Never falls back to the server's working directory: hosts start servers in plugin caches.
    """
    if argument:
        return _as_workspace(argument, "argument")
    if configured:
        return _as_workspace(configured, "--workspace")
    env = os.environ if environ is None else environ
    for name in WORKSPACE_ENV_VARS:
        value = env.get(name)
        if value:
            return _as_workspace(value, name)
    raise TpuAgentError(
        "no-workspace",
        "could not determine the project directory: no workspace argument, no --workspace, and none of "
        + ", ".join(WORKSPACE_ENV_VARS)
        + " is set",
        "Pass workspace='/abs/path/to/repo' in the tool call, or start the server with "
        "'tpu-agent mcp --workspace /abs/path/to/repo'.",
    )


__all__ = ["ARTEFACT_DIR", "WORKSPACE_ENV_VARS", "Workspace", "resolve_workspace"]
