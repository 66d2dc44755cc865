"""Jobs: real subprocesses with bounded logs, deadlines, cancellation of the whole process group."""

from __future__ import annotations

import os
import subprocess
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
    job = jobs.start(
        "run", _py("import sys\nfor i in range(100): print('step', i)\nprint('err', file=sys.stderr)"), ws, timeout_s=60
    )
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


def test_a_full_manager_answers_busy_with_the_running_ids(tmp_path: Path) -> None:
    ws = resolve_workspace(str(tmp_path), None, {})
    jobs = JobManager(max_running=2)
    running = [jobs.start("run", _py("import time; time.sleep(60)"), ws, timeout_s=120) for _ in range(2)]
    with pytest.raises(TpuAgentError) as info:
        jobs.start("run", _py("print('never')"), ws, timeout_s=60)
    assert info.value.code == "busy" and all(job.id in info.value.message for job in running)
    assert "tpu_job_cancel" in info.value.hint
    jobs.cancel(running[0].id)
    third = jobs.start("run", _py("print('ok')"), ws, timeout_s=60)  # a slot is free again
    assert jobs.wait_exit(third, 30) and third.state == JobState.SUCCEEDED
    jobs.shutdown()


def test_the_job_reports_its_commands_own_status_through_the_guard(tmp_path: Path) -> None:
    ws = resolve_workspace(str(tmp_path), None, {})
    jobs = JobManager()
    job = jobs.start("run", _py("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), ws, timeout_s=60)
    assert jobs.wait_exit(job, 30)
    assert job.exit_code == -11 and job.state == JobState.FAILED  # as if the guard were not there


HOST = """\
import sys, time
from tpu_agent.plugins.jobs import JobManager
from tpu_agent.plugins.workspace import resolve_workspace

ws = resolve_workspace(sys.argv[1], None, {})
code = "import subprocess, sys, time\\nc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\\n"
code += "print(c.pid, flush=True)\\ntime.sleep(120)\\n"
job = JobManager().start("run", [sys.executable, "-c", code], ws, timeout_s=600)
while not job.log_tail(1):
    time.sleep(0.05)
print(job.process.pid, job.log_tail(1)[0], flush=True)
time.sleep(600)
"""


def test_jobs_die_when_their_server_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves the server no chance to clean up; the guard's lifeline pipe takes the job group down."""
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, str(tmp_path)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )  # fmt: skip
    try:
        assert host.stdout is not None
        guard, grandchild = (int(pid) for pid in host.stdout.readline().split())
        assert _alive(guard) and _alive(grandchild)
    finally:
        host.kill()
        host.wait()
    deadline = time.monotonic() + 10
    while (_alive(guard) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(guard) and not _alive(grandchild), "the job outlived its server"
