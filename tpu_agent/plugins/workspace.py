"""The workspace an agent works in, resolved explicitly, and the sandbox every tool path goes through.

A coding agent's host starts ``tpu-agent mcp`` from wherever suits it: Claude Code uses the project
directory, Codex and the Agent Plugins spec use the plugin's own cache directory. So the server never
takes its working directory as the user's repository. The workspace comes from, in order: the tool
call's ``workspace`` argument, ``--workspace`` (or ``TPU_AGENT_WORKSPACE``), the harness's project
variable (``CLAUDE_PROJECT_DIR``, which Claude Code sets for the servers it starts), and, on connections
that have them, the client's MCP roots (see ``tpu_agent.plugins.server``); with none of these the call is
refused.

A workspace the server was started with (``--workspace`` or one of those variables) is a boundary: a
call's ``workspace`` argument may only name that directory or one inside it.

Every path a tool receives is resolved (symlinks included) and must stay inside the workspace; nothing
is ever written under ``.git/``, and the server's own artefacts (plans, job logs, profiles) live under
``<workspace>/.tpu-agent/``, which is never followed through a symlink: a state directory that is a link,
not a directory, or owned by someone else is refused, so a cloned repository cannot aim the server's
writes elsewhere.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tpu_agent.errors import ExitCode, TpuAgentError, clipped
from tpu_agent.fsutil import atomic_write_text
from tpu_agent.plugins.limits import MAX_PATH_CHARS

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

    def artefact_dir(self, *parts: str, fresh: bool = False) -> Path:
        """``<workspace>/.tpu-agent/<parts>``, created on demand, every level a real directory we own.

        ``fresh`` insists that the last level is created by this call (a job's own directory), so nothing
        planted there in advance is written through. The directory ignores itself
        (``.tpu-agent/.gitignore``), so plans, logs and profiles never show up as changes in the user's
        repository.
        """
        path = self.artefacts
        _own_directory(path, self.root, fresh=False)
        ignore = path / ".gitignore"
        if not os.path.lexists(ignore):
            atomic_write_text(ignore, "# tpu-agent's plans, job logs and profiles\n*\n")
        for index, part in enumerate(parts):
            path = path / part
            _own_directory(path, self.root, fresh=fresh and index == len(parts) - 1)
        return path

    def state_file(self, directory: Path, name: str) -> Path:
        """A file in one of our state directories that may be (re)written: refused when it is anything but
        a regular file (a planted symlink would make the atomic write land on its target)."""
        path = directory / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return path
        if not stat.S_ISREG(mode):
            raise _unsafe_state(path, self.root, "is a symlink" if stat.S_ISLNK(mode) else "is not a regular file")
        return path

    def resolve(self, user_path: str | os.PathLike[str], *, must_exist: bool = True, for_write: bool = False) -> Path:
        """Resolve ``user_path`` (relative to the workspace, or absolute inside it) and refuse escapes.

        Symlinks are followed before the check, so a link that points out of the workspace is refused
        like ``../``. ``for_write`` also refuses anything under ``.git/``.
        """
        raw = _checked_path_text(str(user_path), "path")
        candidate = Path(raw).expanduser()
        joined = candidate if candidate.is_absolute() else self.root / candidate
        resolved = Path(os.path.realpath(joined))
        if not resolved.is_relative_to(self.root):
            raise TpuAgentError(
                "path-outside-workspace",
                f"path {clipped(raw)} resolves outside the workspace {self.root}",
                "Pass a path relative to the workspace (for example 'train.py' or '.'), or pass "
                "workspace='/abs/path/to/repo' if the project lives elsewhere.",
                ExitCode.REFUSED,
            )
        if for_write and ".git" in resolved.relative_to(self.root).parts:
            raise TpuAgentError(
                "path-in-git-dir",
                f"path {clipped(raw)} is inside .git/, which tpu-agent never writes",
                "Choose a path in the working tree.",
                ExitCode.REFUSED,
            )
        if must_exist and not _exists(resolved):
            raise TpuAgentError(
                "path-not-found",
                f"path {clipped(raw)} does not exist in the workspace {self.root}",
                "Call tpu_scan with paths=['.'] to see the project's files, then pass one of them.",
            )
        return resolved

    def relative(self, path: Path) -> str:
        """The workspace-relative POSIX spelling of ``path`` (what tools return to agents).

        A path inside the workspace keeps its own name even when it is a symlink (a link the engine skipped
        is reported as the link, not as its target); other paths are named by their resolved location.
        """
        for candidate in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
            if candidate.is_relative_to(self.root):
                return candidate.relative_to(self.root).as_posix() or "."
        return str(Path(os.path.realpath(path)))


def _checked_path_text(raw: str, what: str) -> str:
    """Refuse path text no file can have (a NUL byte) or longer than the tools' declared limit."""
    if "\x00" in raw:
        raise TpuAgentError("invalid-argument", f"{what} {clipped(raw)} contains a NUL byte", "Pass a plain path.")
    if len(raw) > MAX_PATH_CHARS:
        raise TpuAgentError(
            "invalid-argument",
            f"{what} {clipped(raw)} is longer than {MAX_PATH_CHARS} characters",
            "Pass a path relative to the workspace.",
        )
    return raw


def _exists(path: Path) -> bool:
    """``path.exists()`` that answers False for names the OS refuses (a component over 255 bytes)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def _unsafe_state(path: Path, root: Path, problem: str) -> TpuAgentError:
    try:
        shown = path.relative_to(root).as_posix()
    except ValueError:
        shown = str(path)
    return TpuAgentError(
        "unsafe-state-dir",
        f"{shown} in the workspace {root} {problem}; tpu-agent keeps its plans, job logs and profiles there and "
        "never writes through a link or into a directory it does not own",
        f"Remove {path} (e.g. `rm -r {path}` after checking what it holds) and call again: tpu-agent recreates "
        f"{ARTEFACT_DIR}/ as a plain directory inside the workspace.",
        ExitCode.REFUSED,
    )


def _own_directory(path: Path, root: Path, *, fresh: bool) -> None:
    """Make ``path`` (its parent already checked) a real directory owned by this process's user, or refuse.

    ``mkdir`` does not follow a symlink in its last component, and ``lstat`` sees the link itself, so a link
    planted at any level is caught before anything is written below it.
    """
    try:
        os.mkdir(path)
    except FileExistsError:
        if fresh:
            raise _unsafe_state(path, root, "already exists, though its name was just generated") from None
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise _unsafe_state(path, root, f"is a symlink (to {os.readlink(path)})")
    if not stat.S_ISDIR(info.st_mode):
        raise _unsafe_state(path, root, "is not a directory")
    if info.st_uid != os.geteuid():
        raise _unsafe_state(path, root, f"is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})")


def _as_workspace(raw: str, source: str) -> Workspace:
    _checked_path_text(raw, f"the workspace (from {source})")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise TpuAgentError(
            "workspace-not-absolute",
            f"the workspace {clipped(raw)} (from {source}) is not an absolute path",
            "Pass the project's absolute path, e.g. workspace='/home/me/repo'.",
        )
    root = Path(os.path.realpath(path))
    if not _exists(root) or not root.is_dir():
        raise TpuAgentError(
            "workspace-not-found",
            f"the workspace {clipped(raw)} (from {source}) is not an existing directory",
            "Pass the absolute path of the project directory.",
        )
    if root == Path(root.anchor):
        raise TpuAgentError(
            "workspace-too-broad",
            f"the workspace {clipped(raw)} (from {source}) is the filesystem root",
            "Pass the project directory itself, not '/'.",
            ExitCode.REFUSED,
        )
    return Workspace(root=root, source=source)


def configured_workspace(configured: str | None, environ: Mapping[str, str] | None = None) -> Workspace | None:
    """The workspace fixed when the server started: ``--workspace``, else the first harness variable set."""
    if configured:
        return _as_workspace(configured, "--workspace")
    env = os.environ if environ is None else environ
    for name in WORKSPACE_ENV_VARS:
        value = env.get(name)
        if value:
            return _as_workspace(value, name)
    return None


def resolve_workspace(
    argument: str | None, configured: str | None, environ: Mapping[str, str] | None = None
) -> Workspace:
    """Pick the workspace for one tool call: the argument, else ``--workspace``, else a harness variable.

    A workspace fixed at start (``--workspace`` or a variable) is the boundary: the argument may narrow it
    to a directory inside, never leave it. Never falls back to the server's working directory: hosts start
    servers in plugin caches.
    """
    fixed = configured_workspace(configured, environ)
    if argument:
        chosen = _as_workspace(argument, "argument")
        if fixed is not None and not chosen.root.is_relative_to(fixed.root):
            raise TpuAgentError(
                "workspace-outside-root",
                f"the workspace argument {clipped(argument)} is outside {fixed.root}, the workspace this server "
                f"was started with ({fixed.source})",
                f"Omit workspace (the tools then use {fixed.root}) or pass a directory inside it; to work on "
                "another project, start a server for it.",
                ExitCode.REFUSED,
            )
        return chosen
    if fixed is not None:
        return fixed
    raise TpuAgentError(
        "no-workspace",
        "could not determine the project directory: no workspace argument, no --workspace, and none of "
        + ", ".join(WORKSPACE_ENV_VARS)
        + " is set",
        "Pass workspace='/abs/path/to/repo' in the tool call, or start the server with "
        "'tpu-agent mcp --workspace /abs/path/to/repo'.",
    )


__all__ = ["ARTEFACT_DIR", "WORKSPACE_ENV_VARS", "Workspace", "configured_workspace", "resolve_workspace"]
