"""The launching side of ``tpu-agent run``: validate, build the environment, start the ranks, supervise.

One rank runs as a single child process (``python -m tpu_agent.runtime.bootstrap``), which behaves like
``python SCRIPT``. More ranks run under torchrun's elastic agent in a child process of its own
(``python -m tpu_agent.runtime.elastic``), so that this process never imports torch, can bound the run with
a timeout from any thread, and can stop every rank by signalling one process: the agent, whose shutdown
path stops its workers (they live in sessions of their own, so a signal to a process group would miss them).

A launcher that is killed outright (SIGKILL, the OOM killer) can forward nothing, so every process it starts
arms a death signal first (:func:`die_with_parent`): the agent is stopped like a Ctrl-C when the launcher
goes, and each rank is killed when the process that started it (the launcher, or the agent) goes.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tpu_agent.chips import get_chip, host_devices, parse_target
from tpu_agent.errors import TpuAgentError
from tpu_agent.runtime.envvars import (
    BACKEND_ENV,
    CHIP_ENV,
    EAGER_MODES,
    apply_env,
    eager_mode_env,
    tpu_launch_env,
)
from tpu_agent.runtime.options import LaunchTarget, RunOptions
from tpu_agent.runtime.run_scope import SURFACE_DIR
from tpu_agent.runtime.select import BackendChoice, select_backend, torch_tpu_importable

TIMEOUT_EXIT_CODE = 124  # what coreutils' timeout(1) returns, so shell scripts read it the same way
# The agent's own shutdown waits up to 30 s for workers before SIGKILLing them; give it that and a margin.
AGENT_SHUTDOWN_GRACE_S = 40.0
WORKER_SHUTDOWN_GRACE_S = 10.0
#: The pid of the process that started a rank or an agent: :func:`die_with_parent` tells from it whether that
#: process was already gone before the death signal was armed. The launcher sets it, the agent resets it.
SUPERVISOR_PID_ENV = "TPU_AGENT_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def note(message: str) -> None:
    """One ``tpu-agent:`` line on stderr (stdout belongs to the user's script)."""
    sys.stderr.write(f"tpu-agent: {message}\n")
    sys.stderr.flush()


def die_with_parent(signum: int) -> None:
    """Have the kernel send ``signum`` to this process when the process that started it dies, however it dies.

    Called first thing by the agent and by every rank started under :data:`SUPERVISOR_PID_ENV` (elsewhere a
    no-op, as on systems without ``prctl``). ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the
    child ends; both forking threads (the launcher's in :func:`launch`, the agent's main thread) wait for their
    child, so that is when the process ends. The MCP job guard uses a pipe instead because its jobs are started
    from worker threads that retire (:mod:`tpu_agent.plugins.jobguard`). A parent that died before the signal
    was armed is caught by comparing the parent pid with the one the parent recorded.
    """
    recorded = os.environ.get(SUPERVISOR_PID_ENV, "")
    if not recorded.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        armed = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return
    if armed and os.getppid() != int(recorded) and not _process_exists(int(recorded)):
        os.kill(os.getpid(), signum)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        pass
    return True


def exit_code_of(returncode: int) -> int:
    """A child's status as a shell reports it: death by signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def validate(target: LaunchTarget, options: RunOptions) -> None:
    """Refuse bad options and a missing script or module before any process starts."""
    if options.nproc < 1:
        raise TpuAgentError("bad-nproc", f"--nproc must be at least 1, got {options.nproc}", "use --nproc 1 or more")
    host_devices(parse_target(options.chip), options.nproc)  # --nproc is per host: at most its devices
    if options.eager_mode is not None and options.eager_mode not in EAGER_MODES:
        raise TpuAgentError(
            "unknown-eager-mode",
            f"unknown eager mode {options.eager_mode!r} (--eager-mode)",
            f"use one of: {', '.join(EAGER_MODES)}",
        )
    if options.timeout_s is not None and options.timeout_s <= 0:
        raise TpuAgentError(
            "bad-timeout", f"--timeout must be positive, got {options.timeout_s}", "give seconds, e.g. --timeout 600"
        )
    check_target(target, Path.cwd())


def check_target(target: LaunchTarget, cwd: Path) -> None:
    """The script must exist; a module's top-level package must be importable from ``cwd`` or sys.path.

    Only the top-level name is looked up here, because finding ``pkg.mod`` would import ``pkg`` (and maybe
    torch) in the launcher; the worker checks the full name before it runs anything.
    """
    if target.is_module:
        top = target.target.split(".")[0]
        if not target.target or importlib.machinery.PathFinder.find_spec(top, [str(cwd), *sys.path[1:]]) is None:
            raise module_not_found(target.target)
        return
    path = Path(target.target)
    if not (path.is_file() or (path.is_dir() and (path / "__main__.py").is_file())):
        raise TpuAgentError(
            code="script-not-found",
            message=f"can't open file {str(path.absolute())!r}: no such script",
            hint="check the path (it is relative to the current directory), or use -m MODULE for a module",
        )


def module_not_found(name: str) -> TpuAgentError:
    """The error for ``-m NAME`` when NAME cannot be imported (shared by launcher and worker)."""
    return TpuAgentError(
        code="module-not-found",
        message=f"no module named {name!r} (-m {name})",
        hint="run from the directory that contains the package, or install it; check the spelling",
    )


def build_env(choice: BackendChoice, options: RunOptions) -> dict[str, str]:
    """The environment every rank starts with: the caller's, the options' extras, the backend and mode."""
    env = dict(os.environ)
    env.update(options.env)
    env[BACKEND_ENV] = choice.name
    env[CHIP_ENV] = parse_target(options.chip).spec
    env[SUPERVISOR_PID_ENV] = str(os.getpid())
    if options.eager_mode is not None:
        apply_env(eager_mode_env(options.eager_mode), env)
    real_torch_tpu = choice.name == "emulated" and torch_tpu_importable()
    if real_torch_tpu and "TORCH_DEVICE_BACKEND_AUTOLOAD" not in options.env:
        # An installed torch_tpu would otherwise autoload on `import torch`: it installs its own device-less
        # torch.tpu module, which the emulation has to own, and without libtpu it aborts the interpreter. The
        # switch also stops the emulation's own autoload, so only the ranks (activated by the bootstrap) get the
        # device then, not the processes the script starts itself.
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    elif choice.name == "emulated" and not real_torch_tpu:
        # `import torch_tpu` finds the emulation's face of the package (the real one is absent: nothing is shadowed;
        # PYTHONPATH comes before site-packages, so a real install, even with autoload left on, must not get it)
        entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(entries if str(SURFACE_DIR) in entries else [*entries, str(SURFACE_DIR)])
    if options.multi_process and options.nnodes == "1":
        env.update(tpu_launch_env(get_chip(options.chip), options.nproc, env))
    return env


def torchrun_args(options: RunOptions) -> list[str]:
    """torchrun's own options for this run (it picks a free localhost rendezvous for one node)."""
    args = [
        "--nproc-per-node", str(options.nproc),
        "--nnodes", options.nnodes,
        "--node-rank", str(options.node_rank),
        "--max-restarts", "0",
    ]  # fmt: skip
    if options.rdzv_backend is not None:
        args += ["--rdzv-backend", options.rdzv_backend]
    elif options.rdzv_endpoint is not None:
        args += ["--rdzv-backend", "c10d"]
    if options.rdzv_endpoint is not None:
        args += ["--rdzv-endpoint", options.rdzv_endpoint]
    if options.master_port is not None:
        args += ["--master-port", str(options.master_port)]
    return args


def command(target: LaunchTarget, options: RunOptions) -> list[str]:
    """The child process's command line."""
    if not options.multi_process:
        return [sys.executable, "-m", "tpu_agent.runtime.bootstrap", *target.python_argv()]
    return [
        sys.executable, "-m", "tpu_agent.runtime.elastic", *torchrun_args(options),
        "-m", "tpu_agent.runtime.bootstrap", *target.python_argv(),
    ]  # fmt: skip


def launch(target: LaunchTarget, options: RunOptions) -> int:
    """Validate, choose the backend (saying why on stderr when it was ``auto``), run and supervise."""
    validate(target, options)
    choice = select_backend(options.backend)
    if options.backend == "auto":
        note(f"backend {choice.name}: {choice.reason}")
    env = build_env(choice, options)
    process = subprocess.Popen(command(target, options), env=env, start_new_session=options.multi_process)
    return supervise(process, options)


def _terminal_delivers_sigint_to_child() -> bool:
    """Whether a Ctrl-C from the terminal reaches the child by itself (same foreground process group)."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def supervise(process: subprocess.Popen[bytes], options: RunOptions) -> int:
    """Wait for the child; pass SIGINT / SIGTERM / SIGHUP on; on timeout stop everything and return 124.

    A job runner that SIGTERMs this process (or its process group) must not orphan the ranks: the agent runs
    in a session of its own, so the signal is forwarded and this process waits for the agent's shutdown.
    SIGINT is forwarded unless the terminal already delivered it to a single-process child.
    """
    ranks = options.nproc
    forward_sigint = options.multi_process or not _terminal_delivers_sigint_to_child()

    def forward(signum: int, frame: object) -> None:
        if process.poll() is None and (signum != signal.SIGINT or forward_sigint):
            process.send_signal(signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.signal(signum, forward) for signum in handled} if in_main_thread else {}
    deadline = None if options.timeout_s is None else time.monotonic() + options.timeout_s
    try:
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return exit_code_of(process.wait(timeout=remaining))
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    stop(process, options.multi_process)
                    what = f"all {ranks} ranks" if ranks > 1 else "the script"
                    note(f"the run exceeded its time limit of {options.timeout_s:g} s; stopped {what}")
                    return TIMEOUT_EXIT_CODE
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop(process: subprocess.Popen[bytes], is_agent: bool) -> None:
    """SIGTERM the child (the agent then stops its workers), SIGKILL it if it does not exit in time."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=AGENT_SHUTDOWN_GRACE_S if is_agent else WORKER_SHUTDOWN_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
