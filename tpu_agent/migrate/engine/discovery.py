"""Which files a migration looks at, of what kind, and which it must leave alone.

Directories are walked in sorted order without following symlinks; version-control, virtual-environment,
cache, ``node_modules`` and build directories are pruned. A symlinked file is never read through: its target
is either inside the given roots (and migrated at its real path) or outside them (reported as skipped), and
writing through a link would replace the link with a file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.migrate.model import FileKind

SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        "node_modules",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        "build",
        "dist",
        ".eggs",
        "site-packages",
    }
)
_SUFFIXES = {
    ".py": FileKind.PYTHON,
    ".ipynb": FileKind.NOTEBOOK,
    ".sh": FileKind.SHELL,
    ".bash": FileKind.SHELL,
    ".zsh": FileKind.SHELL,
    ".env": FileKind.ENV,
    ".yaml": FileKind.YAML,
    ".yml": FileKind.YAML,
    ".dockerfile": FileKind.DOCKERFILE,
    ".cu": FileKind.CUDA_SOURCE,
    ".cuh": FileKind.CUDA_SOURCE,
}
SUPPORTED = (
    ".py, .ipynb, .sh/.bash/.zsh, .env, .yaml/.yml, Dockerfile, .cu/.cuh, "
    "requirements*.txt/pyproject.toml/setup.cfg/Pipfile"
)
_DEPENDENCY_FILE_RE = re.compile(
    r"[\w.-]*(?:requirements|constraints)[\w.-]*\.(?:txt|in)|pyproject\.toml|setup\.cfg|Pipfile",
    re.IGNORECASE,
)


def classify(name: str) -> FileKind | None:
    """The kind of a file from its name, or None for files migrate does not read."""
    if name in ("Dockerfile", "Containerfile") or name.startswith(("Dockerfile.", "Containerfile.")):
        return FileKind.DOCKERFILE
    if name == ".env" or name.startswith(".env."):
        return FileKind.ENV
    if _DEPENDENCY_FILE_RE.fullmatch(name):
        return FileKind.DEPENDENCIES
    return _SUFFIXES.get(os.path.splitext(name)[1].lower())


@dataclass
class Candidate:
    path: Path  # absolute, not resolved through symlinks: where apply() writes
    display_path: str
    kind: FileKind
    skipped_reason: str | None = None


def display(path: Path, cwd: Path) -> str:
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def _is_venv(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "pyvenv.cfg"))


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def discover(paths: Sequence[Path], cwd: Path | None = None) -> list[Candidate]:
    """Every candidate file under ``paths``, in input order (directories sorted), each once."""
    cwd = Path(os.path.abspath(cwd or Path.cwd()))
    given = [Path(os.path.abspath(p)) for p in paths]
    for path in given:
        if not path.exists() and not path.is_symlink():
            raise TpuAgentError(
                "path-not-found", f"{display(path, cwd)}: no such file or directory", hint="check the path and retry"
            )
    roots = [path.resolve() for path in given]
    seen: set[Path] = set()
    out: list[Candidate] = []

    def add(path: Path, kind: FileKind, explicit: bool = False) -> None:
        real = path.resolve()
        if real in seen and not path.is_symlink():
            return
        reason = None
        if path.is_symlink() and explicit:
            reason = f"symlink to {real}: pass the file it points to"
        elif path.is_symlink():
            inside = _within(real, roots)
            reason = (
                f"symlink to {display(real, cwd)}: migrated at its real path, not through the link"
                if inside
                else f"symlink to {real}, outside the given paths: not followed"
            )
        else:
            seen.add(real)
        out.append(Candidate(path, display(path, cwd), kind, reason))

    for path in given:
        if path.is_dir() and not path.is_symlink():
            for directory, dirnames, filenames in os.walk(path, followlinks=False):
                dirnames[:] = sorted(
                    d
                    for d in dirnames
                    if d not in SKIP_DIRS and not d.endswith(".egg-info") and not _is_venv(os.path.join(directory, d))
                )
                for name in sorted(filenames):
                    kind = classify(name)
                    if kind is not None:
                        add(Path(directory) / name, kind)
            continue
        kind = classify(path.name)
        if kind is None:
            if path.is_dir():  # a symlinked directory given explicitly
                raise TpuAgentError(
                    "symlinked-directory",
                    f"{display(path, cwd)} is a symlink to a directory",
                    hint="pass the directory it points to",
                )
            raise TpuAgentError(
                "unsupported-file",
                f"{display(path, cwd)}: not a file migrate reads",
                hint=f"pass a directory or files of these kinds: {SUPPORTED}",
                exit_code=ExitCode.USAGE,
            )
        add(path, kind, explicit=True)
    return out
