"""Ending a child that runs in a session of its own, with everything it started.

A profile's patched run and an MCP job each start their command with ``start_new_session=True``, so the ranks it
launches share its process group and a signal to the group reaches all of them, and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def stop_group(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM ``process``'s group (its own session's), up to ``grace_s`` for it to exit, then SIGKILL to whatever
    of the group is left (ranks that ignored SIGTERM, grandchildren the leader left behind); waits for the leader.
    A group that is already gone is not an error."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
