"""Long work (runs, profiles) as jobs: a subprocess with a handle, a bounded log, a deadline and a kill.

Hosts cut tool calls off (Codex after 60 s by default), and a training run takes as long as it takes,
so ``tpu_run``/``tpu_profile`` start a job, wait a bounded time, and hand back a job id that
``tpu_job_status``/``tpu_job_cancel`` take. Each job is ``sys.executable -m tpu_agent ...`` started
without a shell, under :mod:`tpu_agent.plugins.jobguard`, in its own process group (so cancel reaches every
rank torchrun spawned), with its output merged into one log file that stops growing at a byte cap. A
watchdog kills the group at the job's deadline, :meth:`JobManager.shutdown` kills whatever is still running
when the server exits, and the guard's lifeline pipe kills it when the server dies without a chance to.
The manager runs at most ``max_running`` jobs at once and refuses more with ``busy``.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from tpu_agent.errors import TpuAgentError, clipped
from tpu_agent.plugins.limits import DEFAULT_MAX_JOBS, MAX_FINISHED_JOBS
from tpu_agent.plugins.workspace import Workspace
from tpu_agent.processes import stop_group

#: Seconds between SIGTERM and SIGKILL when a job is stopped.
KILL_GRACE_S = 3.0
#: Log bytes kept per job; the rest of the output is drained and dropped (the log says so).
DEFAULT_MAX_LOG_BYTES = 4 * 1024 * 1024
#: What :func:`new_job_id` produces; anything else is not one of our job ids.
JOB_ID_PATTERN = r"^(run|profile)-[0-9a-f]{8}$"


class JobState(str, Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


@dataclass
class Job:
    """One subprocess started by the server. Mutated only under the manager's lock and its own threads."""

    id: str
    kind: str  # "run" | "profile"
    argv: list[str]
    workspace: Workspace
    log_path: Path
    timeout_s: float
    max_log_bytes: int
    artefact_dir: Path | None  # e.g. the profile's logdir
    process: subprocess.Popen[bytes]  # the job's guard, leader of its process group
    lifeline: int | None = None  # our end of the guard's pipe; closing it stops the job
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    exit_code: int | None = None
    stop_reason: JobState | None = None  # set when the server stopped it (cancel, deadline)
    log_truncated: bool = False
    #: Reads a finished job's outcome when its exit code alone does not tell (``tpu-agent profile`` exits 1
    #: for error-level findings on a script that ran fine); None falls back to the exit code.
    judge: Callable[[Job], JobState | None] | None = None
    _pump: threading.Thread | None = None

    @property
    def state(self) -> JobState:
        if self.exit_code is None:
            return JobState.RUNNING
        if self.stop_reason is not None:
            return self.stop_reason
        verdict = self.judge(self) if self.judge is not None else None
        if verdict is not None:
            return verdict
        return JobState.SUCCEEDED if self.exit_code == 0 else JobState.FAILED

    @property
    def elapsed_s(self) -> float:
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    @property
    def done(self) -> bool:
        return self.exit_code is not None

    def log_tail(self, lines: int) -> list[str]:
        """The last ``lines`` lines of the log (reads at most the last 256 KiB)."""
        if lines <= 0 or not self.log_path.exists():
            return []
        with self.log_path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - 256 * 1024))
            data = handle.read()
        text = data.decode("utf-8", errors="replace")
        return text.splitlines()[-lines:]

    def last_line(self) -> str | None:
        tail = self.log_tail(1)
        return tail[0][:200] if tail else None


def _terminate_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the job's process group, then SIGKILL it if it is still there after a grace period (a job whose
    leader has exited is left to its guard)."""
    if process.poll() is None:
        stop_group(process, KILL_GRACE_S)


class JobManager:
    """Every job this server started, by id. Thread-safe: sync tools run on worker threads."""

    def __init__(self, max_running: int = DEFAULT_MAX_JOBS) -> None:
        self.max_running = max_running
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def running(self) -> list[Job]:
        with self._lock:
            return [job for job in self._jobs.values() if not job.done]

    def start(
        self,
        kind: str,
        argv: Sequence[str],
        workspace: Workspace,
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        artefact_dir: Path | None = None,
        max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
        job_id: str | None = None,
        judge: Callable[[Job], JobState | None] | None = None,
    ) -> Job:
        """Start ``argv`` in the workspace, its output going to ``.tpu-agent/jobs/<id>/output.log``.

        Refused with ``busy`` when ``max_running`` jobs are still running.
        """
        job_id = job_id or new_job_id(kind)
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env["PYTHONUNBUFFERED"] = "1"
        with self._lock:  # count and start under one lock, so concurrent calls cannot both take the last slot
            running = sorted(job.id for job in self._jobs.values() if not job.done)
            if len(running) >= self.max_running:
                raise TpuAgentError(
                    "busy",
                    f"{len(running)} jobs are running, the most this server runs at once: {', '.join(running)}",
                    "Wait for one to finish (tpu_job_status with wait_s=30) or stop one (tpu_job_cancel), then "
                    "call again; the limit is `tpu-agent mcp --max-jobs`.",
                )
            log_path = workspace.artefact_dir("jobs", job_id, fresh=True) / "output.log"
            read_end, lifeline = os.pipe()
            try:
                process = subprocess.Popen(  # an argv list, no shell
                    [sys.executable, "-m", "tpu_agent.plugins.jobguard", str(read_end), "--", *argv],
                    cwd=workspace.root,
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(read_end,),
                )
            except BaseException:
                os.close(lifeline)
                raise
            finally:
                os.close(read_end)
            job = Job(
                id=job_id,
                kind=kind,
                argv=list(argv),
                workspace=workspace,
                log_path=log_path,
                timeout_s=timeout_s,
                max_log_bytes=max_log_bytes,
                artefact_dir=artefact_dir,
                process=process,
                lifeline=lifeline,
                judge=judge,
            )
            self._jobs[job_id] = job
            self._forget_old_locked()
        job._pump = threading.Thread(target=self._pump_output, args=(job,), name=f"job-{job_id}", daemon=True)
        job._pump.start()
        return job

    def _forget_old_locked(self) -> None:
        """Drop the oldest finished jobs beyond :data:`MAX_FINISHED_JOBS` (their logs stay on disk)."""
        finished = [job for job in self._jobs.values() if job.done]
        for job in sorted(finished, key=lambda j: j.started)[: max(0, len(finished) - MAX_FINISHED_JOBS)]:
            del self._jobs[job.id]

    def _pump_output(self, job: Job) -> None:
        """Copy the job's output to its log up to the cap, enforce the deadline, record the exit."""
        output = job.process.stdout
        assert isinstance(output, io.BufferedReader)  # Popen(stdout=PIPE), unbuffered text off
        deadline = job.started + job.timeout_s
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), self._expire, args=(job,))
        watchdog.daemon = True
        watchdog.start()
        written = 0
        with job.log_path.open("xb") as log:  # "x": a file planted in the fresh job directory is not followed
            for chunk in iter(lambda: output.read1(65536), b""):
                if written < job.max_log_bytes:
                    keep = chunk[: job.max_log_bytes - written]
                    log.write(keep)
                    log.flush()
                    written += len(keep)
                    if len(keep) < len(chunk):
                        job.log_truncated = True
                        log.write(b"\n[tpu-agent: log cap reached; further output dropped]\n")
                        log.flush()
        code = job.process.wait()
        watchdog.cancel()
        _close_lifeline(job)
        job.ended = time.monotonic()
        job.exit_code = code

    def _expire(self, job: Job) -> None:
        if job.process.poll() is None:
            job.stop_reason = JobState.TIMED_OUT
            _terminate_group(job.process)

    def get(self, job_id: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
            known = sorted(self._jobs, key=lambda name: self._jobs[name].started)[-10:]
        if job is None:
            raise TpuAgentError(
                "unknown-job",
                f"no job {clipped(job_id)} in this server",
                ("Latest jobs: " + ", ".join(known) + ". " if known else "")
                + "Job ids come from tpu_run or tpu_profile; jobs do not survive a server restart.",
            )
        return job

    def cancel(self, job_id: str) -> tuple[Job, bool]:
        """Stop the job's whole process group; returns the job and whether it was still running."""
        job = self.get(job_id)
        was_running = job.process.poll() is None
        if was_running:
            job.stop_reason = JobState.CANCELLED
            _terminate_group(job.process)
        self.wait_exit(job, KILL_GRACE_S + 2)
        return job, was_running

    @staticmethod
    def wait_exit(job: Job, seconds: float) -> bool:
        """Block up to ``seconds`` until the job's exit is recorded (log fully pumped)."""
        if job._pump is not None:
            job._pump.join(timeout=max(0.0, seconds))
        return job.done

    def shutdown(self) -> None:
        """Kill every job that is still running (called when the server exits)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            if job.process.poll() is None:
                job.stop_reason = JobState.CANCELLED
                _terminate_group(job.process)
            _close_lifeline(job)


def _close_lifeline(job: Job) -> None:
    lifeline, job.lifeline = job.lifeline, None
    if lifeline is not None:
        os.close(lifeline)


def is_job_id(text: str) -> bool:
    return re.fullmatch(JOB_ID_PATTERN, text) is not None


def new_job_id(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(4)}"


__all__ = ["DEFAULT_MAX_LOG_BYTES", "JOB_ID_PATTERN", "Job", "JobManager", "JobState", "is_job_id", "new_job_id"]
