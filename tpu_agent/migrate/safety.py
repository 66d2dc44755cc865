"""The checks that stand between a plan and the user's files.

``apply`` writes only after every check here has passed for every file, so a refusal leaves the tree
exactly as it was. Three questions are asked:

* Is the write target inside the tree the user named? A symlink inside ``./repo`` that points at
  ``/etc`` or at a sibling checkout must never be written through (:func:`containing_root`).
* Would the write destroy work git cannot give back? Files with uncommitted changes (modified, staged or
  untracked) are refused unless the user says ``--allow-dirty`` (:func:`dirty_files`).
* Is the output directory a safe place for a migrated copy? Not inside the source, not holding the
  source, and either empty or a previous ``tpu-agent`` output of the same sources
  (:func:`check_output_dir`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from tpu_agent.errors import ExitCode, TpuAgentError

OUTPUT_MARKER = ".tpu-agent-output.json"  # written into every --output-dir, so a rerun may reuse it


def real(path: Path) -> Path:
    """The absolute path with every symlink resolved (what a write would really touch)."""
    return Path(os.path.realpath(path))


def is_within(path: Path, base: Path) -> bool:
    """True when ``path`` is ``base`` or below it (both already resolved)."""
    return path == base or base in path.parents


def tree_base(root: Path) -> Path:
    """The resolved place a root allows writes in: a directory root's real path, or a file root itself.

    A file root's final component is not resolved, so a named file that is a symlink to somewhere else
    does not widen what may be written.
    """
    resolved = real(root)
    if resolved.is_dir():
        return resolved
    return real(root.parent) / root.name


def containing_root(path: Path, roots: Sequence[Path]) -> Path | None:
    """The root whose tree really holds ``path`` after resolving symlinks, or None when it leaves them all."""
    target = real(path)
    for root in roots:
        if is_within(target, tree_base(root)):
            return root
    return None


def _git_toplevel(directory: Path) -> Path | None:
    result = subprocess.run(
        ["git", "-C", str(directory), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        return None
    return real(Path(result.stdout.strip()))


def dirty_files(paths: Iterable[Path]) -> list[Path]:
    """The files among ``paths`` (resolved) that lie in a git work tree and differ from its last commit.

    Modified, staged and untracked files all count: overwriting any of them loses something git cannot
    restore. Files outside any work tree, or on a machine without git, are never dirty.
    """
    if shutil.which("git") is None:
        return []
    by_repo: dict[Path, list[Path]] = defaultdict(list)
    toplevels: dict[Path, Path | None] = {}
    for path in paths:
        target = real(path)
        directory = target.parent
        if directory not in toplevels:
            toplevels[directory] = _git_toplevel(directory)
        top = toplevels[directory]
        if top is not None:
            by_repo[top].append(target)
    dirty: list[Path] = []
    for top, files in by_repo.items():
        relative = [str(f.relative_to(top)) for f in files]
        result = subprocess.run(
            ["git", "-C", str(top), "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *relative],
            capture_output=True,
            check=False,
        )
        if result.returncode != 0:
            raise TpuAgentError(
                "git-status-failed",
                f"git status failed in {top}: {result.stderr.decode(errors='replace').strip()}",
                "Fix the repository, or pass --allow-dirty to skip the uncommitted-changes check.",
                ExitCode.REFUSED,
            )
        wanted = set(files)
        dirty.extend(top / name for name in _porcelain_paths(result.stdout) if (top / name) in wanted)
    return sorted(set(dirty))


def _porcelain_paths(output: bytes) -> list[str]:
    """File names from ``git status --porcelain -z`` (a rename entry is followed by its old name)."""
    entries = output.decode("utf-8", errors="surrogateescape").split("\0")
    names: list[str] = []
    index = 0
    while index < len(entries):
        entry = entries[index]
        index += 1
        if len(entry) < 4:
            continue
        names.append(entry[3:])
        if entry[0] in "RC":
            index += 1  # skip the rename/copy source
    return names


def refuse_dirty(paths: Sequence[Path], display: dict[Path, str]) -> None:
    """Raise REFUSED naming the files with uncommitted changes among ``paths``."""
    dirty = dirty_files(paths)
    if not dirty:
        return
    shown = ", ".join(display.get(p, str(p)) for p in dirty[:5])
    more = f" and {len(dirty) - 5} more" if len(dirty) > 5 else ""
    raise TpuAgentError(
        "dirty-worktree",
        f"{len(dirty)} file(s) to rewrite have uncommitted changes: {shown}{more}",
        "Commit or stash them first so the rewrite can be reviewed and undone with git, "
        "or pass --allow-dirty, or write a copy with --output-dir DIR.",
        ExitCode.REFUSED,
    )


def check_output_dir(output_dir: Path, roots: Sequence[Path]) -> None:
    """Refuse an output directory that would mix the copy with its source or clobber unrelated files."""
    out = real(output_dir)
    for root in roots:
        source = tree_base(root)
        if is_within(out, source):
            raise TpuAgentError(
                "output-inside-source",
                f"--output-dir {output_dir} lies inside the source {root}",
                "Choose a directory outside the tree being migrated.",
                ExitCode.REFUSED,
            )
        if is_within(source, out):
            raise TpuAgentError(
                "source-inside-output",
                f"the source {root} lies inside --output-dir {output_dir}",
                "Choose an output directory that does not contain the code being migrated.",
                ExitCode.REFUSED,
            )
    if out.exists() and not out.is_dir():
        raise TpuAgentError(
            "output-not-a-directory",
            f"--output-dir {output_dir} exists and is not a directory",
            "Pass a new or empty directory.",
            ExitCode.USAGE,
        )
    if out.is_dir() and any(out.iterdir()) and not is_previous_output(out, roots):
        raise TpuAgentError(
            "output-not-empty",
            f"--output-dir {output_dir} is not empty and is not a previous tpu-agent output of these sources",
            "Pass a new or empty directory (a previous output of the same sources is reused).",
            ExitCode.REFUSED,
        )


def output_marker(roots: Sequence[Path]) -> str:
    """The marker text an output directory carries: which sources it is a migrated copy of."""
    return json.dumps({"tool": "tpu-agent migrate", "sources": [str(tree_base(r)) for r in roots]}, indent=2) + "\n"


def is_previous_output(directory: Path, roots: Sequence[Path]) -> bool:
    """True when ``directory`` holds the marker of an earlier copy of exactly these sources."""
    marker = directory / OUTPUT_MARKER
    try:
        return marker.read_text(encoding="utf-8") == output_marker(roots)
    except (OSError, UnicodeDecodeError):
        return False
