"""The migrate engine: discovery, prefilter, one libcst pass per file, notebooks and text files.

:func:`build_plan` is the contract the public API (:mod:`tpu_agent.migrate.api`) builds on: it examines files,
fills a :class:`~tpu_agent.migrate.model.Plan` and touches nothing on disk. Files are read and prefiltered in
the calling process; the parse work goes to a process pool when there is enough of it, and results come back
in input order whatever order the workers finish in.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from tpu_agent.migrate.engine.discovery import Candidate, discover
from tpu_agent.migrate.engine.prefilter import may_need_migration
from tpu_agent.migrate.engine.worker import migrate_file, whole_file_rules
from tpu_agent.migrate.model import FileResult, MigrateOptions, Plan

# Below this much parse work a pool costs more to start than it saves.
POOL_MIN_BYTES = 256 * 1024


def _pool_context() -> multiprocessing.context.BaseContext:
    # forkserver: workers start from a clean process (no threads of the caller, e.g. a progress bar), with
    # the engine and its rules imported once in the server.
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["tpu_agent.migrate.engine.worker"])
        return ctx
    return multiprocessing.get_context("spawn")


def _read(candidate: Candidate) -> bytes:
    if candidate.skipped_reason:
        return b""
    return candidate.path.read_bytes()


def build_plan(
    paths: Sequence[Path],
    options: MigrateOptions,
    progress: Callable[[int, int], None] | None = None,
) -> Plan:
    """Examine ``paths`` (files or directories) and return what migrating them would change, and why."""
    candidates = discover([Path(p) for p in paths])
    total = len(candidates)
    results: list[FileResult | None] = [None] * total
    done = 0

    def finished(index: int, result: FileResult) -> None:
        nonlocal done
        results[index] = result
        done += 1
        if progress is not None:
            progress(done, total)

    heavy: list[tuple[int, bytes]] = []
    for index, candidate in enumerate(candidates):
        data = _read(candidate)
        needs_parse = (
            not candidate.skipped_reason
            and candidate.kind not in whole_file_rules()
            and may_need_migration(data)
        )
        if needs_parse:
            heavy.append((index, data))
        else:
            finished(index, migrate_file(candidate, data, options))

    jobs = options.jobs or os.cpu_count() or 1
    work_bytes = sum(len(data) for _, data in heavy)
    if jobs > 1 and len(heavy) > 1 and work_bytes >= POOL_MIN_BYTES:
        with ProcessPoolExecutor(max_workers=min(jobs, len(heavy)), mp_context=_pool_context()) as pool:
            futures = {
                pool.submit(migrate_file, candidates[index], data, options): index for index, data in heavy
            }
            for future in as_completed(futures):
                finished(futures[future], future.result())
    else:
        for index, data in heavy:
            finished(index, migrate_file(candidates[index], data, options))
    roots = [Path(os.path.abspath(p)) for p in paths]
    return Plan(roots=roots, options=options, files=[r for r in results if r is not None])


__all__ = ["build_plan"]
