"""The one error type every subpackage raises for bad input or refused actions.

The CLI renders it as a one-line message plus a hint and exits with :attr:`exit_code`; the MCP server
returns :attr:`code`, :attr:`message` and :attr:`hint` as a structured tool error. Keeping the three
fields on one object means a new failure is described once and reads the same on both front ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

#: How much of a caller's text an error message repeats.
ECHO_CHARS = 120


class ExitCode(IntEnum):
    """Stable process exit codes of every ``tpu-agent`` command (scripts and CI depend on them)."""

    OK = 0
    FINDINGS = 1  # --check found changes or manual items; diagnose found errors
    USAGE = 2  # bad argument, missing file, unparsable input
    REFUSED = 3  # a safety check refused the action (dirty git tree, stale plan, path escape)
    INTERNAL = 4  # a bug in tpu-agent itself


@dataclass
class TpuAgentError(Exception):
    """An error a user (or an agent) can act on.

    ``code`` is a stable, grep-able identifier such as ``"path-outside-workspace"``; ``message`` says what
    happened, naming the file, line or argument; ``hint`` says what to do next.
    """

    code: str
    message: str
    hint: str = ""
    exit_code: ExitCode = ExitCode.USAGE

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "hint": self.hint}


def clipped(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` as an error message may repeat it: whole when short, else its start and its length, so an
    oversized path, id or code never comes back whole."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def file_error(error: OSError) -> TpuAgentError:
    """An operating-system error about a file the user named (a name too long, no permission, a full disk, a
    file gone meanwhile): said with the file and the system's words, not as a tpu-agent bug."""
    name = clipped(str(error.filename)) if error.filename is not None else "a file"
    return TpuAgentError(
        "file-error",
        f"{name}: {error.strerror or type(error).__name__}",
        "Check the path (and its permissions, and the free space where it is written), then run again.",
    )
