"""The migrate engine: discovery, prefilter, one libcst pass per file, notebooks and text files.

:func:`build_plan` is the contract the public API (:mod:`tpu_agent.migrate.api`) builds on: it examines files,
fills a :class:`~tpu_agent.migrate.model.Plan` and touches nothing on disk. Files are read and prefiltered in
the calling process, which also finds the ``"cuda"``/``"nccl"`` constants other modules of the tree import
(:mod:`~tpu_agent.migrate.analysis.crossmodule`, while the workers start on the files that define none) and hands
each defining file what its importers do with them; the parse work goes to a process pool when
there is enough of it, and results come back in input order whatever order the workers finish in. A file that vanishes or turns into something other than
a regular file is reported as skipped; a worker that dies takes no result with it: the files it left
unfinished are migrated again one by one in sacrificial processes
(:func:`~tpu_agent.migrate.engine.guard.run_isolated`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from tpu_agent.fsutil import read_regular
from tpu_agent.migrate.analysis.crossmodule import ImportedFlow, PythonFile, definitions, imported_uses
from tpu_agent.migrate.engine.discovery import Candidate, discover
from tpu_agent.migrate.engine.guard import SourceProblem, process_context, run_isolated
from tpu_agent.migrate.engine.prefilter import may_need_migration
from tpu_agent.migrate.engine.worker import migrate_file, whole_file_rules
from tpu_agent.migrate.model import FileKind, FileResult, MigrateOptions, Plan, sha256_bytes

# Below this much parse work a pool costs more to start than it saves.
POOL_MIN_BYTES = 256 * 1024


def _read(candidate: Candidate) -> tuple[Candidate, bytes]:
    """The file's bytes; a file that cannot be read (gone, swapped for a FIFO...) becomes a skipped candidate."""
    if candidate.skipped_reason:
        return candidate, b""
    try:
        return candidate, read_regular(candidate.path)
    except OSError as error:
        reason = f"{candidate.display_path}: could not be read ({error.strerror or error}): skipped"
        return dataclasses.replace(candidate, skipped_reason=reason), b""


def _python_files(candidates: Sequence[Candidate]) -> list[PythonFile]:
    """The Python files' contents for the cross-module scan. Read here apart from the per-file pass: the pass
    reads each file again right before migrating it (its bytes are what the plan records), so a file that
    changes or vanishes meanwhile is judged by what is on disk then, and only reported for what it holds."""
    files = []
    for candidate in candidates:
        if candidate.kind is FileKind.PYTHON and not candidate.skipped_reason:
            read, data = _read(candidate)
            if not read.skipped_reason:
                files.append(PythonFile(candidate.path, candidate.display_path, data))
    return files


def _isolated_file(candidate: Candidate, data: bytes, options: MigrateOptions) -> FileResult:
    """Migrate one file in its own sacrificial process: what a crashed pool left unfinished goes through here."""
    try:
        return run_isolated(migrate_file, (candidate, data, options), options.file_budget_s, process_context())
    except SourceProblem as problem:
        return FileResult(
            path=candidate.path,
            display_path=candidate.display_path,
            kind=candidate.kind,
            original_sha256=sha256_bytes(data),
            skipped_reason=f"{candidate.display_path}: skipped: {problem}; migrate this file by hand",
        )


def build_plan(
    paths: Sequence[Path],
    options: MigrateOptions,
    progress: Callable[[int, int], None] | None = None,
) -> Plan:
    """Examine ``paths`` (files or directories) and return what migrating them would change, and why."""
    discovered = discover([Path(p) for p in paths])
    candidates = discovered.candidates
    total = len(candidates)
    results: list[FileResult | None] = [None] * total
    done = 0

    def finished(index: int, result: FileResult) -> None:
        nonlocal done
        results[index] = result
        done += 1
        if progress is not None:
            progress(done, total)

    python_files = _python_files(candidates)
    defined = definitions(python_files)

    def with_imported(index: int, imported: dict[Path, dict[str, tuple[ImportedFlow, ...]]]) -> Candidate:
        """The candidate with what its importers do with its constants (only files in ``defined`` have any)."""
        candidate = candidates[index]
        if candidate.path in imported:
            candidate = candidates[index] = dataclasses.replace(candidate, imported_flows=imported[candidate.path])
        return candidate

    heavy: list[tuple[int, bytes]] = []
    for index, candidate in enumerate(candidates):
        candidate, data = _read(candidate)
        candidates[index] = candidate
        needs_parse = (
            not candidate.skipped_reason and candidate.kind not in whole_file_rules() and may_need_migration(data)
        )
        if needs_parse:
            heavy.append((index, data))
        else:
            finished(index, migrate_file(candidate, data, options))

    jobs = options.jobs or os.cpu_count() or 1
    work_bytes = sum(len(data) for _, data in heavy)
    if jobs > 1 and len(heavy) > 1 and work_bytes >= POOL_MIN_BYTES:
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(heavy)), mp_context=process_context())
        try:
            # the files that define no constant go to the workers first; the cross-module scan runs here meanwhile,
            # and the defining files follow with its result
            futures = {
                pool.submit(migrate_file, candidates[index], data, options): index
                for index, data in heavy
                if candidates[index].path not in defined
            }
            imported = imported_uses(python_files, defined)
            for index, data in heavy:
                if candidates[index].path in defined:
                    futures[pool.submit(migrate_file, with_imported(index, imported), data, options)] = index
            for future in as_completed(futures):
                finished(futures[future], future.result())
        except BrokenProcessPool:
            for index, data in heavy:
                if results[index] is None:
                    finished(index, _isolated_file(candidates[index], data, options))
        except BaseException:  # Ctrl-C or SIGTERM: drop the queued files instead of migrating them all first
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True)
    else:
        imported = imported_uses(python_files, defined)
        for index, data in heavy:
            finished(index, migrate_file(with_imported(index, imported), data, options))
    roots = [Path(os.path.abspath(p)) for p in paths]
    files = [r for r in results if r is not None]
    return Plan(roots=roots, options=options, files=files, stale_temp_files=discovered.stale_temp_files)


__all__ = ["build_plan"]
