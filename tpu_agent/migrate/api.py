"""The public migrate API: ``plan`` what would change, then ``apply`` it, in place or into a copy.

The split is the safety model. :func:`plan` reads and never writes, so ``--diff``, ``--check``, the
reports and the MCP tools all run on a plan. :func:`apply` writes a plan only after every file has passed
every check (inside the named tree, unchanged since the plan, no uncommitted git work at stake), so a
refusal leaves the tree untouched; each file is then replaced atomically (:mod:`tpu_agent.fsutil`), so a
crash leaves either the old or the new content, never half of it. Applying a plan twice is a no-op: a
file that already holds the migrated bytes is recognised and left alone. A run killed mid-write leaves at
most a temporary file of ours next to its target; the next in-place apply removes those it finds and lists
them in :attr:`ApplyResult.removed_temp_files`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.fsutil import atomic_write_bytes, atomic_write_text, not_regular, read_regular
from tpu_agent.migrate.model import ApplyResult, FileResult, MigrateOptions, Plan, sha256_bytes
from tpu_agent.migrate.safety import (
    OUTPUT_MARKER,
    check_output_dir,
    containing_root,
    is_within,
    output_marker,
    real,
    refuse_dirty,
)

ProgressCallback = Callable[[int, int], None]


def plan(
    paths: Sequence[Path | str], options: MigrateOptions | None = None, progress: ProgressCallback | None = None
) -> Plan:
    """Examine ``paths`` (files or directories) and return what migrating them would change.

    Touches nothing on disk. ``progress(done, total)`` is called as files are processed. Raises
    :class:`TpuAgentError` (exit code USAGE) naming the first path that does not exist, or a rule code in
    ``options.select``/``options.ignore`` that matches no rule (``unknown-rule``); codes are upper-cased, so
    the plan's options hold them canonical.
    """
    roots = [Path(p) for p in paths]
    if not roots:
        raise TpuAgentError("no-paths", "no path to migrate was given", "Pass one or more files or directories.")
    for root in roots:
        if root.is_symlink() and not root.exists():
            raise TpuAgentError(
                "broken-symlink", f"{root}: is a symlink to a missing file", "Fix the link or pass its target."
            )
        if not root.exists():
            raise TpuAgentError("path-not-found", f"{root}: no such file or directory", "Check the path and try again.")
    # Imported here: the engine pulls in libcst and every rule, which apply() and the renderers do not need.
    from tpu_agent.migrate.engine import build_plan
    from tpu_agent.migrate.rules import with_rule_selection

    return build_plan(roots, with_rule_selection(options or MigrateOptions()), progress)


def apply(plan: Plan, *, output_dir: Path | None = None, allow_dirty: bool = False) -> ApplyResult:
    """Write ``plan``: rewrite files in place, or write a migrated copy of the whole tree into ``output_dir``.

    Refuses (exit code REFUSED, nothing written) when a file changed since the plan, when a file would be
    written outside the planned paths (e.g. through a symlink leaving the tree), when an in-place rewrite
    would overwrite uncommitted git changes (unless ``allow_dirty``), or when ``output_dir`` lies inside the
    source or holds unrelated files. ``ApplyResult.written`` lists the absolute paths created or replaced.
    """
    pending = _pending_writes(plan)
    if output_dir is not None:
        return _apply_copy(plan, Path(output_dir), pending)
    if not allow_dirty:
        refuse_dirty([r.path for r in pending], {real(r.path): r.display_path for r in pending})
    removed = _remove_stale_temp_files(plan)
    written: list[Path] = []
    for result in pending:
        assert result.migrated_bytes is not None  # _pending_writes keeps only changed files
        _write(Path(result.path), result.migrated_bytes, result.display_path, written)
    unchanged = sorted({real(r.path) for r in plan.files} - set(written))
    return ApplyResult(written=written, unchanged=unchanged, removed_temp_files=removed)


def _remove_stale_temp_files(plan: Plan) -> list[Path]:
    """Delete the temporary files of an interrupted run that the plan found, if they are still stale and
    still inside the planned tree (checked again now: the plan may be old)."""
    from tpu_agent.migrate.engine.discovery import is_stale_temp_file

    removed: list[Path] = []
    for path in plan.stale_temp_files:
        if containing_root(path, plan.roots) is None or not is_stale_temp_file(path):
            continue
        try:
            path.unlink()
        except OSError:
            continue  # gone already, or not ours to remove: nothing was half-written either way
        removed.append(path)
    return removed


def _pending_writes(plan: Plan) -> list[FileResult]:
    """The changed files whose content on disk still matches the plan, after refusing escaping and stale files.

    A file already holding its migrated bytes (an earlier apply) is not pending, which makes a second
    apply a no-op.
    """
    pending: list[FileResult] = []
    stale: list[str] = []
    seen: set[Path] = set()
    for result in plan.changed_files:
        if result.skipped_reason is not None:
            continue
        target = real(result.path)
        if target in seen:  # two planned paths reaching one file (a symlink inside the tree)
            continue
        seen.add(target)
        if containing_root(result.path, plan.roots) is None:
            raise TpuAgentError(
                "path-escape",
                f"{result.display_path} resolves to {target}, outside the paths being migrated",
                "A symlink leads out of the tree; migrate its target directly if it should change.",
                ExitCode.REFUSED,
            )
        try:
            data = target.read_bytes()
        except OSError:
            stale.append(result.display_path)
            continue
        if sha256_bytes(data) == result.original_sha256:
            pending.append(result)
        elif data != result.migrated_bytes:
            stale.append(result.display_path)
    if stale:
        shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        raise TpuAgentError(
            "stale-plan",
            f"{len(stale)} file(s) changed since the plan was made: {shown}",
            "Plan again (rerun the command) so the rewrite starts from the current contents.",
            ExitCode.REFUSED,
        )
    return pending


def _write(path: Path, data: bytes, display: str, written: list[Path]) -> None:
    """Atomically replace ``path``; a failure names the file and what was already written."""
    try:
        atomic_write_bytes(path, data)
    except OSError as error:
        already = f" ({len(written)} file(s) were written before it)" if written else " (nothing was written)"
        raise TpuAgentError(
            "write-failed",
            f"could not write {display}: {error.strerror or error}{already}",
            "The file keeps its previous content; free space or fix permissions and run again.",
            ExitCode.REFUSED,
        ) from error
    written.append(real(path))


def _apply_copy(plan: Plan, output_dir: Path, pending: list[FileResult]) -> ApplyResult:
    """Write a migrated copy of every root into ``output_dir``; the source tree is only read."""
    check_output_dir(output_dir, plan.roots)
    out = Path(os.path.abspath(output_dir))
    out.mkdir(parents=True, exist_ok=True)
    out_real = real(out)
    atomic_write_text(out / OUTPUT_MARKER, output_marker(plan.roots))
    migrated = {real(r.path): r.migrated_bytes for r in pending if r.migrated_bytes is not None}
    # Files an earlier apply already migrated in place hold their migrated bytes; copying them is right.
    # The copy leaves out what discovery never walks (VCS data, virtual environments, caches, build output).
    from tpu_agent.migrate.engine.discovery import SKIP_DIRS, TEMP_FILE_RE

    base = _common_base(plan.roots)
    written: list[Path] = []
    unchanged: list[Path] = []
    not_copied: list[str] = []
    copied: list[Path] = []
    for source in _tree_entries(plan.roots, SKIP_DIRS):
        if TEMP_FILE_RE.fullmatch(source.name):
            continue  # a temporary file of an interrupted run: not part of the tree
        dest = out / source.relative_to(base)
        if not is_within(real(dest.parent), out_real):
            raise TpuAgentError(
                "path-escape",
                f"{dest} would be written outside --output-dir {output_dir}",
                "Remove the symlinked directory from the output directory, or use a new one.",
                ExitCode.REFUSED,
            )
        if source.is_symlink():
            _copy_link(source, dest, written, unchanged)
            continue
        try:
            info = os.lstat(source)
            kind = not_regular(info.st_mode)
            if kind is not None:
                not_copied.append(f"{source}: {kind}, not a regular file")
                continue
            data = migrated.get(real(source))
            as_is = data is None
            if data is None:
                data = read_regular(source)
        except OSError as error:  # vanished or changed since the plan: report it and copy the rest
            not_copied.append(f"{source}: could not be read ({error.strerror or error})")
            continue
        mode = stat.S_IMODE(info.st_mode)
        if dest.is_symlink():
            dest.unlink()
        elif dest.is_file() and stat.S_IMODE(dest.stat().st_mode) == mode and dest.read_bytes() == data:
            unchanged.append(real(dest))
            continue
        _write(dest, data, str(dest), written)
        os.chmod(dest, mode)
        if as_is:
            copied.append(written[-1])
    return ApplyResult(written=written, unchanged=unchanged, output_dir=out_real, not_copied=not_copied, copied=copied)


def _copy_link(source: Path, dest: Path, written: list[Path], unchanged: list[Path]) -> None:
    """Recreate a symlink as a symlink (never copy or write through what it points at)."""
    link = os.readlink(source)
    if dest.is_symlink() and os.readlink(dest) == link:
        unchanged.append(Path(os.path.abspath(dest)))
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    os.symlink(link, dest)
    written.append(Path(os.path.abspath(dest)))


def _common_base(roots: Sequence[Path]) -> Path:
    """The directory the copy mirrors: a directory root itself, else the deepest common parent."""
    dirs = [os.path.abspath(r) if r.is_dir() else os.path.dirname(os.path.abspath(r)) for r in roots]
    return Path(os.path.commonpath(dirs))


def _tree_entries(roots: Sequence[Path], skip_dirs: frozenset[str]) -> Iterator[Path]:
    """Every file and symlink under the roots (absolute, not following directory links, pruning ``skip_dirs``)."""
    seen: set[Path] = set()
    for root in roots:
        top = Path(os.path.abspath(root))
        if not top.is_dir():
            if top not in seen:
                seen.add(top)
                yield top
            continue
        for directory, dirnames, filenames in os.walk(top, followlinks=False):
            here = Path(directory)
            links = [d for d in dirnames if (here / d).is_symlink()]
            dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs and d not in links)
            for name in sorted([*filenames, *links]):
                entry = here / name
                if entry not in seen:
                    seen.add(entry)
                    yield entry
