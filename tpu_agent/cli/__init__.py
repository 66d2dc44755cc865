"""The ``tpu-agent`` command line: typer + rich front end over the subpackages' public APIs.

Each command group lives in its own module (``migrate``, ``runtime``, ``profile``, ``plugins``) and
exposes ``register(app)``; this module only assembles them, so the CLI never holds logic of its own.
"""

from __future__ import annotations

import sys
import traceback

import typer

from tpu_agent import __version__
from tpu_agent.cli import check as check_commands
from tpu_agent.cli import estimate as estimate_commands
from tpu_agent.cli import migrate as migrate_commands
from tpu_agent.cli import plugins as plugin_commands
from tpu_agent.cli import profile as profile_commands
from tpu_agent.cli import rules as rules_commands
from tpu_agent.cli import runtime as runtime_commands
from tpu_agent.cli._output import console_err
from tpu_agent.errors import ExitCode, TpuAgentError

app = typer.Typer(
    name="tpu-agent",
    help=(
        "Move CUDA PyTorch code onto Google TPUs through TorchTPU, then tune it.\n\n"
        "Examples:\n\n"
        "  tpu-agent migrate ./repo --diff\n\n"
        "  tpu-agent run --nproc 2 train.py --epochs 1\n\n"
        "  tpu-agent profile train.py --steps 10\n\n"
        "  tpu-agent estimate --chip v5e-4 train.py\n\n"
        "  tpu-agent rules TPU101"
    ),
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"tpu-agent {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Move CUDA PyTorch code onto Google TPUs through TorchTPU, then tune it."""


def _one_line_summaries(typer_app: typer.Typer) -> None:
    """Command lists show each command's first help paragraph on one line, however its source wraps it."""
    for command in typer_app.registered_commands:
        if command.short_help is None and command.help:
            command.short_help = " ".join(command.help.split("\n\n", 1)[0].split())
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


for _module in (
    migrate_commands,
    rules_commands,
    runtime_commands,
    profile_commands,
    estimate_commands,
    check_commands,
    plugin_commands,
):
    _module.register(app)
_one_line_summaries(app)


def main() -> None:
    """Console-script entry point: runs the app and turns :class:`TpuAgentError` into its exit code."""
    try:
        app(standalone_mode=True)
    except TpuAgentError as error:  # raised outside a command body (e.g. in a callback)
        console_err.print(f"[bold red]error[/]: {error}")
        sys.exit(int(error.exit_code))
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:  # a bug in tpu-agent: exit 4 so --check users never mistake it for "findings" (1)
        traceback.print_exc()
        console_err.print(
            "[bold red]internal error[/]: this is a bug in tpu-agent; please report it with the traceback above."
        )
        sys.exit(int(ExitCode.INTERNAL))


__all__ = ["app", "main", "ExitCode"]
