"""Jobs: real subprocesses with bounded logs, deadlines, cancellation of the whole process group."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tpu_agent.errors import TpuAgentError
from tpu_agent.plugins.jobs import JobManager, JobState
from tpu_agent.plugins.workspace import resolve_workspace


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_job_succeeds_and_its_log_tail_is_bounded(tmp_path: Path) -> None:
    ws = resolve_workspace(str(tmp_path), None, {})
    jobs = JobManager()
    job = jobs.start("run", _py("import sys\nfor i in range(100): print('step', i)\nprint('err', file=sys.stderr)"), ws, timeout_s=60)
    assert jobs.wait_exit(job, 30)
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0
    assert job.log_tail(2) == ["step 99", "err"]
    assert job.log_path.is_relative_to(tmp_path.resolve() / ".tpu-agent" / "jobs")


def test_failed_job_reports_its_exit_code(tmp_path: Path) -> None:
    ws = resolve_workspace(str(tmp_path), None, {})
    jobs = JobManager()
    job = jobs.start("run", _py("raise SystemExit(3)"), ws, timeout_s=60)
    assert jobs.wait_exit(job, 30)
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)


def test_output_is_capped(tmp_path: Path) -> None:
    ws = resolve_workspace(str(tmp_path), None, {})
    jobs = JobManager()
    job = jobs.start("run", _py("print('x' * 100000)"), ws, timeout_s=60, max_log_bytes=1000)
    assert jobs.wait_exit(job, 30)
    assert job.log_truncated
    assert job.log_path.stat().st_size < 1200
    assert job.state == JobState.SUCCEEDED  # the child was drained, not blocked on a full pipe


def test_deadline_kills_the_job(tmp_path: Path) -> None:
    ws = resolve_workspace(str(tmp_path), None, {})
    jobs = JobManager()
    job = jobs.start("run", _py("import time\nprint('started', flush=True)\ntime.sleep(60)"), ws, timeout_s=1)
    assert jobs.wait_exit(job, 20)
    assert job.state == JobState.TIMED_OUT
    assert job.elapsed_s < 15


def test_cancel_kills_every_process_of_the_job(tmp_path: Path) -> None:
    ws = resolve_workspace(str(tmp_path), None, {})
    jobs = JobManager()
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    job = jobs.start("run", _py(code), ws, timeout_s=120)
    deadline = time.monotonic() + 20
    while not job.log_tail(1) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(job.log_tail(1)[0])
    assert _alive(grandchild)
    cancelled, was_running = jobs.cancel(job.id)
    assert was_running and cancelled.state == JobState.CANCELLED
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
    again, was_running = jobs.cancel(job.id)  # idempotent
    assert not was_running and again.state == JobState.CANCELLED


def test_shutdown_kills_running_jobs(tmp_path: Path) -> None:
    ws = resolve_workspace(str(tmp_path), None, {})
    jobs = JobManager()
    job = jobs.start("run", _py("import time; time.sleep(60)"), ws, timeout_s=120)
    jobs.shutdown()
    assert jobs.wait_exit(job, 10)
    assert job.state == JobState.CANCELLED


def test_unknown_job_names_the_known_ones(tmp_path: Path) -> None:
    jobs = JobManager()
    with pytest.raises(TpuAgentError) as info:
        jobs.get("run-nope")
    assert info.value.code == "unknown-job"
