"""Which files a migration looks at, of what kind, and which it must leave alone.

Directories are walked in sorted order without following symlinks; version-control, virtual-environment,
cache, ``node_modules`` and build directories are pruned. A symlinked file is never read through: its target
is either inside the given roots (and migrated at its real path) or outside them (reported as skipped), and
writing through a link would replace the link with a file. Only regular files are read: a FIFO, socket or
device named ``*.py`` would block the reader forever, so it is reported as skipped, and a file is opened
without following links and checked again after opening (it may have been swapped meanwhile).

The walk also notes the temporary files an interrupted in-place run left behind (:data:`TEMP_FILE_RE`), so
that the next in-place apply can remove them and say so.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.fsutil import TEMP_PREFIX, TEMP_SUFFIX, not_regular
from tpu_agent.migrate.analysis.crossmodule import ImportedFlow
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

# The temporary files tpu_agent.fsutil writes next to a target before renaming it over the target:
# "<TEMP_PREFIX><name>.<8 random characters from tempfile.mkstemp><TEMP_SUFFIX>". Killed mid-write, a run
# leaves one.
TEMP_FILE_RE = re.compile(rf"{re.escape(TEMP_PREFIX)}.+\.[a-z0-9_]{{8}}{re.escape(TEMP_SUFFIX)}")
# Younger temp files may belong to a write in progress (another run); they are left alone.
STALE_TEMP_AGE_S = 10.0


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
    # for a module defining a "cuda"/"nccl" constant: what the tree's modules importing it do with it
    imported_flows: Mapping[str, tuple[ImportedFlow, ...]] = field(default_factory=dict)


@dataclass
class Discovered:
    """What a walk found: the files to examine and the stale temporary files of an interrupted run."""

    candidates: list[Candidate]
    stale_temp_files: list[Path] = field(default_factory=list)


def is_stale_temp_file(path: Path, now: float | None = None) -> bool:
    """A regular file named like our temporary files and old enough not to be a write in progress."""
    if not TEMP_FILE_RE.fullmatch(path.name):
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and (now or time.time()) - info.st_mtime >= STALE_TEMP_AGE_S


def display(path: Path, cwd: Path) -> str:
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def _is_venv(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "pyvenv.cfg"))


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def discover(paths: Sequence[Path], cwd: Path | None = None) -> Discovered:
    """Every candidate file under ``paths``, in input order (directories sorted), each once, and the stale
    temporary files found on the way."""
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
    stale: list[Path] = []
    now = time.time()

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
            try:
                special = not_regular(os.lstat(path).st_mode)
            except OSError as error:
                special = f"gone before it could be read ({error.strerror or error})"
            if special is not None:
                reason = f"{display(path, cwd)}: {special}: not read"
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
                    elif name.endswith(".tpu-agent-tmp") and is_stale_temp_file(Path(directory) / name, now):
                        stale.append(Path(directory) / name)
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
    return Discovered(out, stale)
