"""The leader of every job's process group: runs the job's command and takes the whole group down with
the server, however the server ends.

``python -m tpu_agent.plugins.jobguard LIFELINE_FD -- ARGV...`` is what the MCP server actually starts for
a job, in a new session (so the guard leads the job's process group). The server keeps the write end of a
pipe whose read end is ``LIFELINE_FD``; the kernel closes it when the server exits for any reason, SIGKILL
and OOM kills included, and the guard reads end-of-file. It then sends SIGTERM to its process group (every
rank and helper the command started), waits a grace period, and sends SIGKILL.

Why a pipe and not only ``PR_SET_PDEATHSIG``: the death signal follows the *thread* that forked the child,
not the process, so a job started from a worker thread would be killed when that thread retires; and it
reaches only the direct child, not the ranks below it. The pipe is closed exactly when the last copy of the
server's end goes, and the guard's killpg reaches the whole group.

The guard survives SIGTERM itself (the server's cancel and deadline signal the whole group) so that it
outlives the command, then exits the way the command did: with its exit code, or by the same signal, so the
server sees the command's own status. It imports nothing from tpu_agent, so it starts in milliseconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

#: Seconds between SIGTERM and SIGKILL when the server is gone (a cancel uses the server's own grace).
ORPHAN_GRACE_S = 2.0


def _watch_lifeline(fd: int) -> None:
    """Block until the server's end of the pipe closes, then stop every process of this group."""
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os.killpg(0, signal.SIGTERM)  # the guard's own handler ignores it; the command and its ranks get it
    time.sleep(ORPHAN_GRACE_S)
    os.killpg(0, signal.SIGKILL)  # and this ends the guard too


def _exit_like(returncode: int) -> None:
    """Leave with the command's status: its exit code, or death by the same signal."""
    if returncode >= 0:
        sys.exit(returncode)
    signum = -returncode
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)  # a signal whose default action is not to terminate


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: python -m tpu_agent.plugins.jobguard LIFELINE_FD -- COMMAND [ARG...]\n")
        sys.exit(2)
    lifeline = int(argv[0])
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A Python handler, not SIG_IGN: exec resets handlers, so the command still dies of these signals.
        signal.signal(signum, lambda *_: None)
    command = subprocess.Popen(argv[2:])  # the server's argv list, no shell
    threading.Thread(target=_watch_lifeline, args=(lifeline,), name="lifeline", daemon=True).start()
    _exit_like(command.wait())


if __name__ == "__main__":
    main(sys.argv[1:])
