"""The one error type every subpackage raises for bad input or refused actions.

The CLI renders it as a one-line message plus a hint and exits with :attr:`exit_code`; the MCP server
returns :attr:`code`, :attr:`message` and :attr:`hint` as a structured tool error. Keeping the three
fields on one object means a new failure is described once and reads the same on both front ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


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
