"""Option types shared by several commands, defined once so that ``run``, ``profile``, ``estimate`` and
``check`` spell and validate them the same way."""

from __future__ import annotations

from enum import Enum
from typing import Any

import typer

from tpu_agent.chips import DEFAULT_CHIP, TARGET_EXAMPLES, parse_target
from tpu_agent.errors import TpuAgentError
from tpu_agent.runtime.envvars import DEFER_AND_FUSE, EAGER_MODES, LAUNCH_BLOCKING
from tpu_agent.runtime.xla.settings import COMPILER_ENV, COMPILERS, DEFAULT_COMPILER

EagerModeChoice = Enum("EagerModeChoice", {name.replace("-", "_"): name for name in EAGER_MODES}, type=str)  # type: ignore[misc]  # functional Enum: members come from the runtime's one table

Compiler = Enum("Compiler", {name: name for name in COMPILERS}, type=str)  # type: ignore[misc]


def eager_mode_option() -> Any:
    """An ``--eager-mode`` option (``None`` when not given: the environment's switches decide, as TorchTPU reads
    them), its choices and the variables it sets named by the runtime's one table."""
    return typer.Option(
        None,
        "--eager-mode",
        help=f"{' | '.join(EAGER_MODES)}; sets {LAUNCH_BLOCKING.name} / {DEFER_AND_FUSE.name} for every rank.",
    )


def compiler_option() -> Any:
    """A ``--compiler`` option (``None`` when not given: the environment's ``TPU_AGENT_COMPILER``, else the
    default), so that ``run``, ``profile`` and ``check`` choose the emulation's graph compiler the same way."""
    return typer.Option(
        None,
        "--compiler",
        help=f"Emulation only: xla compiles torch.compile and DeferAndFuse graphs with XLA (default: {DEFAULT_COMPILER}); "
        "eager runs them op by op.",
    )


def compiler_env(compiler: Compiler | None) -> dict[str, str]:
    """The variable that carries ``--compiler`` to every rank the command starts (none when not given, so the
    caller's own ``TPU_AGENT_COMPILER`` stays in force)."""
    return {COMPILER_ENV: compiler.value} if compiler is not None else {}


def _validate_chip(value: str | None) -> str | None:
    """Refuse an unknown ``--chip`` at parse time with the accepted spellings, and return its canonical form."""
    if value is None:
        return None
    try:
        return parse_target(value).spec
    except TpuAgentError as error:
        raise typer.BadParameter(f"{error.message}; {error.hint}") from None


def chip_option(default: str | None = DEFAULT_CHIP, purpose: str = "TPU the emulation presents") -> Any:
    """A ``--chip`` option: a generation or a slice, validated by :func:`tpu_agent.chips.parse_target`."""
    return typer.Option(default, "--chip", callback=_validate_chip, help=f"{purpose}: {TARGET_EXAMPLES}.")
