"""A serving check worker: one long-lived process answers many models, for sweeps over hundreds of them.

A fresh worker per model spends most of its time importing torch, transformers and Dynamo (tens of seconds on
a loaded machine, against a few seconds to check a tiny model). :class:`ServingWorker` keeps one process
(``python -m tpu_agent.check.worker --serve``) and sends it one model after another; between models the
worker drops Dynamo's caches and collects garbage, and a process that has grown past ``recycle_mb`` is
replaced. A worker that dies (a crash in native code) or runs past
the per-model timeout is killed and its model gets the same ``WorkerDied`` / ``Timeout`` verdict that
:func:`tpu_agent.check.check_model` gives; the next model starts a fresh process.

What a shared process cannot promise is isolation (one model's leaked state might affect the next), so a
sweep re-checks every failure with :func:`tpu_agent.check.check_model` in fresh processes before reporting it.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from tpu_agent.check.api import (
    CheckOptions,
    died,
    memory_limit,
    read_worker_result,
    timed_out,
    worker_env,
    worker_request,
)
from tpu_agent.check.model import CheckReport, ModelInfo
from tpu_agent.check.spec import ModelSpec


def _resident_mb(pid: int) -> int:
    """Resident memory of process ``pid`` in MiB (0 where /proc cannot tell)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


class ServingWorker:
    """One serving worker process, started on first use and restarted after a crash or a timeout."""

    def __init__(self, options: CheckOptions, backend: str, recycle_mb: int = 3000) -> None:
        self.options = options
        self.backend = backend
        self.recycle_mb = recycle_mb  # restart the process once it holds more than this after a model
        self._scratch = tempfile.TemporaryDirectory(prefix="tpu-agent-check-pool-")
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._count = 0

    def _start(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        # O_APPEND, so that truncating the file before each model leaves no hole where the worker writes next
        self._stderr = open(Path(self._scratch.name) / "stderr.log", "a+b")  # noqa: SIM115 (lives with the process)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tpu_agent.check.worker", "--serve"],
            env=worker_env(self.options, self.backend, self.options.modes[0]),
            preexec_fn=memory_limit(self.options.max_memory_mb),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )
        return self._process

    def _stop(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
            for stream in (self._process.stdin, self._process.stdout):
                if stream is not None:
                    stream.close()
        if self._stderr is not None:
            self._stderr.close()
        self._process, self._stderr = None, None

    def _wait_for_answer(self, process: subprocess.Popen[bytes]) -> str:
        """``done``, ``died`` or ``timeout``."""
        assert process.stdout is not None
        deadline = time.monotonic() + self.options.timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                if selector.select(timeout=left):
                    line = process.stdout.readline()
                    return "done" if line.strip() == b"done" else "died"

    def _stderr_text(self) -> str:
        assert self._stderr is not None
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def check(self, spec: ModelSpec, modes: tuple[str, ...] | None = None) -> CheckReport:
        """Check ``spec`` in ``modes`` (default: the options'), in this worker's process (started if needed)."""
        mode_list = list(modes or self.options.modes)
        process = self._start()
        assert process.stdin is not None and self._stderr is not None
        self._stderr.truncate(0)
        self._count += 1
        request_path = Path(self._scratch.name) / f"request-{self._count}.json"
        result_path = Path(self._scratch.name) / f"result-{self._count}.json"
        request: dict[str, Any] = {**worker_request(spec, mode_list, self.options), "switch_modes": True}
        request_path.write_text(json.dumps(request), encoding="utf-8")
        model: ModelInfo | None = None
        try:
            process.stdin.write(f"{request_path}\t{result_path}\n".encode())
            process.stdin.flush()
            outcome = self._wait_for_answer(process)
        except BrokenPipeError:
            outcome = "died"
        if outcome == "done" and result_path.is_file():
            model, results = read_worker_result(json.loads(result_path.read_text(encoding="utf-8")))
        elif outcome == "timeout":
            self._stop()
            results = timed_out(mode_list, self.options.timeout_s)
        else:
            returncode = process.wait()
            results = died(mode_list, returncode, self._stderr_text())
            self._stop()
        for path in (request_path, result_path):
            path.unlink(missing_ok=True)
        if self._process is not None and _resident_mb(self._process.pid) > self.recycle_mb:
            self._stop()  # freed tensors stay in the allocator's arenas: a fresh process is smaller
        info = model or ModelInfo(spec=spec.target, kind=spec.kind, task=spec.task or "")
        return CheckReport(info, results, backend=self.backend, matmul_precision=self.options.matmul_precision)

    def close(self) -> None:
        """Stop the process and remove the scratch directory."""
        self._stop()
        self._scratch.cleanup()

    def __enter__(self) -> ServingWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ServingWorker"]
