"""Multi-rank runs: torchrun's elastic agent in a process of its own, with a one-line failure summary.

``python -m tpu_agent.runtime.elastic TORCHRUN_ARGS... -m tpu_agent.runtime.bootstrap TARGET...`` parses the
arguments with torchrun's own parser and runs torchrun's ``run`` (so rendezvous, ``--nnodes``,
``--rdzv-*`` and ``--master-port`` mean exactly what they mean to torchrun), with ``--max-restarts 0``:
when one rank fails the agent stops the others, and this module names the rank that failed first and exits
with its exit code. SIGINT / SIGTERM make the agent stop every rank; the exit code is then 128 + signal.

Which rank failed *first* is not something torchrun knows precisely (its failure timestamps have one-second
resolution, and a crash in one rank makes its peers fail in their next collective a moment later). So every
rank's bootstrap writes an exit record with a nanosecond timestamp into :data:`RUN_DIR_ENV`, and the
earliest record wins. A rank that crashed on a signal other than the agent's own SIGTERM, or exited without
a record (``os._exit``), comes before any recorded failure: its peers only failed because it was gone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_agent.runtime.launcher import SUPERVISOR_PID_ENV, die_with_parent, exit_code_of, note

RUN_DIR_ENV = "TPU_AGENT_RUN_DIR"
EXIT_RECORD_PATTERN = "exit-rank{rank}.json"


@dataclass(frozen=True)
class RankFailure:
    """The rank that brought the run down, its exit code as a shell reports it, and what happened."""

    rank: int
    local_rank: int
    pid: int
    exit_code: int
    detail: str


def write_exit_record(rank: int, exit_code: int, error: str, time_ns: int) -> None:
    """Called by a failing rank's bootstrap just before it exits (no-op outside a multi-rank run)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return
    record = {"rank": rank, "exit_code": exit_code, "error": error, "time_ns": time_ns}
    path = Path(run_dir) / EXIT_RECORD_PATTERN.format(rank=rank)
    try:
        path.write_text(json.dumps(record), encoding="utf-8")
    except OSError:
        pass  # the agent falls back to torchrun's own failure order


def read_exit_records(run_dir: Path) -> dict[int, dict[str, object]]:
    records: dict[int, dict[str, object]] = {}
    for path in run_dir.glob("exit-rank*.json"):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            records[int(record["rank"])] = record
        except (OSError, ValueError, KeyError):
            continue
    return records


# Signals the agent itself sends when it stops the surviving ranks: a rank that died of one is collateral.
_SHUTDOWN_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _cause_order(rank: int, failure: Any, records: dict[int, dict[str, object]]) -> tuple[int, int]:
    """Sort key: lower is more likely the root cause (see the module docstring)."""
    code = failure.exitcode
    if code < 0 and signal.Signals(-code) not in _SHUTDOWN_SIGNALS:
        return (0, rank)  # crashed (SIGSEGV, SIGKILL by the OOM killer, abort...)
    if code > 0 and rank not in records:
        return (1, rank)  # os._exit(n) or a death the bootstrap could not see
    if rank in records:
        return (2, int(records[rank]["time_ns"]))  # type: ignore[call-overload]
    return (3, rank)  # stopped by the agent


def root_failure(failures: dict[int, Any], records: dict[int, dict[str, object]]) -> RankFailure:
    """Pick the rank whose failure caused the others' (see the module docstring for the rule)."""
    rank = min(failures, key=lambda r: _cause_order(r, failures[r], records))
    failure = failures[rank]
    if rank in records and records[rank].get("error"):
        detail = str(records[rank]["error"])
    elif failure.exitcode < 0:
        detail = f"killed by {signal.Signals(-failure.exitcode).name}"
    else:
        detail = ""
    return RankFailure(rank, failure.local_rank, failure.pid, exit_code_of(failure.exitcode), detail)


def main(argv: list[str]) -> int:
    die_with_parent(signal.SIGTERM)  # a killed launcher stops the ranks as its Ctrl-C would
    os.environ[SUPERVISOR_PID_ENV] = str(os.getpid())  # the ranks' parent is this agent
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tpu-agent-run-") as run_dir:
        os.environ[RUN_DIR_ENV] = run_dir
        try:
            torchrun.run(args)
        except ChildFailedError as error:
            failure = root_failure(error.failures, read_exit_records(Path(run_dir)))
            detail = f" ({failure.detail})" if failure.detail else ""
            note(
                f"rank {failure.rank} (local rank {failure.local_rank}, pid {failure.pid}) failed with exit code "
                f"{failure.exit_code}{detail}; stopped the other ranks"
            )
            return failure.exit_code
        except SignalException as error:
            note(f"received {signal.Signals(error.sigval).name}; stopped all ranks")
            return 128 + int(error.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
