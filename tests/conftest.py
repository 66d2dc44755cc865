"""Suite-wide fixtures and scheduling: :func:`run_once`, which computes an expensive module fixture once per test
session, tests marked ``long`` started first, and caches kept to the session.

pytest-xdist runs a module-scoped fixture once per worker that runs any of the module's tests, and its work
stealing moves the tail of one worker's queue to another, splitting modules: a fixture that launches torch
processes (seconds to tens of seconds of CPU) then runs twice. Fixtures that go through :func:`run_once` run on
the first worker that needs them; any other worker waits for that result and reads it.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock


@pytest.hookimpl(trylast=True)  # after pytest's own tmp_path set-up
def pytest_configure(config: pytest.Config) -> None:
    """The session's graph compiler (op by op, see below), and where what tpu-agent caches while the suite runs
    (XLA executables, TPU compile results): a folder of the session, shared by its workers and the processes they
    start, never the user's caches, so every session compiles afresh, as CI does. Both cache variables are set:
    test subprocesses drop ``TPU_AGENT_*`` settings (all but the compiler), and then the cache goes under
    ``XDG_CACHE_HOME``."""
    from tpu_agent.fsutil import CACHE_DIR_ENV
    from tpu_agent.runtime.xla.settings import COMPILER_ENV, EAGER

    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    os.environ[CACHE_DIR_ENV] = str(base / "tpu-agent-cache")
    os.environ["XDG_CACHE_HOME"] = str(base / "xdg-cache")
    # Graphs run op by op unless a test chooses XLA (the XLA tests do) or the developer runs the whole suite through
    # XLA (TPU_AGENT_COMPILER=xla pytest), whatever the product's default: an XLA compile per graph and shape in every
    # DeferAndFuse and compile test would not fit the suite's time budget, and they test the recorder and Dynamo.
    os.environ.setdefault(COMPILER_ENV, EAGER)
    # Profile runs verify every diff they offer with one more run of the script each (seconds of CPU per diff): off by
    # default here, so the suite's many captures stay within its time budget; tests/profile/test_verify_profile.py and
    # the long-marked sweep pass --verify and check it.
    from tpu_agent.profile.options import VERIFY_ENV

    os.environ.setdefault(VERIFY_ENV, "0")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts) starts one worker more than the machine has cores. A fifth of the suite's
    time is tests waiting: on a time limit (``--timeout``, a hanging collective), on ranks meeting at a rendezvous,
    on a child's start-up; with one worker per core that core idles meanwhile. Measured on 2 cores, whole suite:
    556 s with 2 workers, 482 s with 3, 518 s with 4 (the CPU-bound tests then crowd each other)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


LONG_DEFAULT_S = 30.0  # what a ``long`` mark without ``seconds=`` counts as: "half a minute or more"


def _long_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("long")
    return float(marker.kwargs.get("seconds", LONG_DEFAULT_S)) if marker is not None else 0.0


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: the shares are those of the tests that run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``long`` first in each worker's share, the rest in collection order.

    pytest-xdist's worksteal hands each worker a contiguous share of the list (the first ``n // W`` items, then a
    ``W - 1``-th of the rest, ...) and an idle worker steals from the end of the longest queue: a minute-long test
    met near the end of a share runs alone while the others have nothing left, and the run waits for it. So each
    share starts with long tests, which stealing never takes: the longest first, each to the share with the least
    long work so far (``@pytest.mark.long(seconds=N)`` says how long a test is when far over half a minute). With
    them all at the head of the list, the first worker's share held every one, run one after another."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    long_tests = sorted((item for item in items if _long_seconds(item)), key=_long_seconds, reverse=True)
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for item in long_tests:
        least = loads.index(min(loads))
        shares[least].append(item)
        loads[least] += _long_seconds(item)
    rest = iter([item for item in items if not _long_seconds(item)])
    ordered: list[pytest.Item] = []
    for index, share in enumerate(shares):
        size = (len(items) - len(ordered)) // (workers - index)  # the share xdist sends this worker
        ordered += share + list(itertools.islice(rest, max(0, size - len(share))))
    ordered += rest
    items[:] = ordered


RunOnce = Callable[[str, Callable[[Path], Any]], Any]


@pytest.fixture(scope="session")
def run_once(tmp_path_factory: pytest.TempPathFactory) -> RunOnce:
    """``run_once(name, compute)``: ``compute(directory)``'s JSON-able result, computed by one worker per session.

    ``directory`` is an empty folder kept for the session, where ``compute`` may leave files its users read (an
    event log, a migrated tree): every worker sees the same folder, so users copy what they change. The result
    comes back through JSON (tuples as lists, dictionary keys as strings), also on the worker that computed it,
    so that every worker sees the same value. A ``compute`` that fails leaves no result: the next worker tries
    again and reports the failure in its own tests.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, shared by its workers (each has its own basetemp below it)
    root = base / "run-once"
    root.mkdir(exist_ok=True)

    def run(name: str, compute: Callable[[Path], Any]) -> Any:
        result = root / f"{name}.json"
        with FileLock(root / f"{name}.lock"):
            if not result.is_file():
                directory = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))  # fresh, also after a failed try
                value = json.dumps(compute(directory))
                partial = result.with_suffix(".partial")
                partial.write_text(value, encoding="utf-8")
                partial.replace(result)
            return json.loads(result.read_text(encoding="utf-8"))

    return run
