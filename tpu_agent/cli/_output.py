"""Output plumbing shared by every command: ``--format``, JSON emission and error rendering.

Agents read ``--format json`` from stdout; people read rich text. Human diagnostics and progress go to
stderr so that stdout stays machine-readable in every format.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from tpu_agent.errors import ExitCode, TpuAgentError, file_error

console = Console()
console_err = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


class OutputFormat(str, Enum):
    """The formats a command can print; not every command supports every one (each says which)."""

    text = "text"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"
    html = "html"


FORMAT_HELP = "Output format: text for people, json for agents and scripts."


def print_json(data: Any) -> None:
    """Write ``data`` as indented JSON to stdout (no rich markup, no wrapping)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def fail(error: TpuAgentError, output_format: OutputFormat = OutputFormat.text) -> None:
    """Report ``error`` in the requested format and exit with its code."""
    if output_format == OutputFormat.json:
        print_json({"error": error.to_dict()})
    else:
        # soft_wrap: a path or command in the message is never broken into pieces (rich hard-wraps at 80
        # columns when stderr is a pipe, which is how agents and scripts read it); a terminal wraps visually.
        # escaped: messages and hints quote paths and commands (`pip install "tpu-agent[estimate]"`) that rich
        # would otherwise read as markup and drop
        console_err.print(
            f"[bold red]error[/] [dim]({error.code})[/]: {escape(error.message)}", highlight=False, soft_wrap=True
        )
        if error.hint:
            console_err.print(f"  [bold]hint[/]: {escape(error.hint)}", highlight=False, soft_wrap=True)
    raise typer.Exit(int(error.exit_code))


def handles_errors(func: F) -> F:
    """Decorator for command bodies: a :class:`TpuAgentError` becomes a clean message and its exit code, and
    so does an operating-system error about a named file (``File name too long`` for a 100,000-character
    argument was a traceback and exit code 4).

    The command's ``output_format`` keyword (when it has one) decides whether the error is JSON.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TpuAgentError as error:
            fail(error, kwargs.get("output_format", OutputFormat.text))
        except OSError as error:
            if error.filename is None:
                raise
            fail(file_error(error), kwargs.get("output_format", OutputFormat.text))

    return wrapper  # type: ignore[return-value]


__all__ = ["ExitCode", "OutputFormat", "FORMAT_HELP", "console", "console_err", "print_json", "fail", "handles_errors"]
