"""CLI commands of ``tpu_agent.runtime``: ``run`` and ``doctor`` (argument parsing and rendering only)."""

from __future__ import annotations

from enum import Enum

import typer
from rich.markup import escape

from tpu_agent.cli._options import (
    Compiler,
    EagerModeChoice,
    chip_option,
    compiler_env,
    compiler_option,
    eager_mode_option,
)
from tpu_agent.cli._output import (
    FORMAT_HELP,
    OutputFormat,
    console,
    handles_errors,
    print_json,
)
from tpu_agent.errors import TpuAgentError
from tpu_agent.runtime.select import BACKENDS

Backend = Enum("Backend", {name: name for name in BACKENDS}, type=str)  # type: ignore[misc]

RUN_HELP = """Run a script (or -m MODULE) on the TorchTPU 'tpu' device: real torch_tpu on a TPU host, the CPU
emulation elsewhere. Everything after SCRIPT belongs to the script, as with python.

Examples:

  tpu-agent run train.py --epochs 1

  tpu-agent run --nproc 2 --eager-mode defer-and-fuse train.py

  tpu-agent run -m mypkg.train --lr 3e-4

  tpu-agent run --compiler xla --eager-mode defer-and-fuse train.py

  tpu-agent run --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29400 --nproc 4 train.py
"""

DOCTOR_HELP = """Show torch / torch_tpu / libtpu / jax versions, the backend a run would use and why, the chip and
the eager mode the environment selects.

Examples:

  tpu-agent doctor

  tpu-agent doctor --format json
"""


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise TpuAgentError(
                "bad-env", f"--env {pair!r} is not of the form NAME=VALUE", "e.g. --env TORCH_TPU_ENABLE_DEBUG_CHECKS=1"
            )
        env[name] = value
    return env


@handles_errors
def run(
    ctx: typer.Context,
    command: list[str] = typer.Argument(
        ..., metavar="SCRIPT [ARGS]...", help="Script path (or module name with -m) and its arguments."
    ),
    module: bool = typer.Option(False, "-m", "--module", help="Treat SCRIPT as a module name, like python -m."),
    nproc: int = typer.Option(
        1, "--nproc", "--nproc-per-node", min=1, help="Ranks on this host (torchrun --nproc-per-node)."
    ),
    backend: Backend = typer.Option(
        "auto", "--backend", help="auto: real torch_tpu when it sees a TPU, else the emulation."
    ),
    chip: str = chip_option(),
    eager_mode: EagerModeChoice | None = eager_mode_option(),
    nnodes: str = typer.Option("1", "--nnodes", help="Number of hosts, or MIN:MAX (torchrun)."),
    node_rank: int = typer.Option(0, "--node-rank", help="This host's rank (torchrun)."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of the rendezvous (torchrun)."),
    rdzv_backend: str | None = typer.Option(
        None, "--rdzv-backend", help="Rendezvous backend, e.g. c10d or static (torchrun)."
    ),
    master_port: int | None = typer.Option(None, "--master-port", help="Port for the static rendezvous (torchrun)."),
    env: list[str] = typer.Option([], "--env", "-e", help="Extra NAME=VALUE for every rank (repeatable)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Stop every rank after this many seconds (exit 124)."),
    compiler: Compiler | None = compiler_option(),
) -> None:
    from tpu_agent.chips import check_process_count, parse_target
    from tpu_agent.runtime.api import LaunchTarget, RunOptions, launch

    source = ctx.get_parameter_source("chip")
    if source is not None and source.name != "DEFAULT":  # a chip the user named: its hosts' process counts
        check_process_count(parse_target(chip), nproc)
    target = LaunchTarget(command[0], list(command[1:]), is_module=module)
    options = RunOptions(
        nproc=nproc,
        backend=backend.value,
        chip=chip,
        eager_mode=eager_mode.value if eager_mode is not None else None,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        master_port=master_port,
        env={**_parse_env(env), **compiler_env(compiler)},
        timeout_s=timeout,
        rdzv_backend=rdzv_backend,
    )
    code = launch(target, options)
    raise typer.Exit(code)


@handles_errors
def doctor(
    output_format: OutputFormat = typer.Option(OutputFormat.text, "--format", help=FORMAT_HELP),
) -> None:
    from tpu_agent.runtime.api import doctor as run_doctor

    if output_format not in (OutputFormat.text, OutputFormat.json):
        raise TpuAgentError(
            "bad-format", f"doctor prints text or json, not {output_format.value}", "use --format text or --format json"
        )
    report = run_doctor()
    if output_format == OutputFormat.json:
        print_json(report.to_dict())
        return
    console.print("[bold]tpu-agent doctor[/]")
    console.print(f"  python      {report.python}")
    for name, version in report.versions.items():
        console.print(f"  {name:<11} {version}", highlight=False)
    console.print(f"  backend     [bold]{report.backend.name}[/]: {report.backend.reason}", highlight=False)
    console.print(f"  TPU devices {', '.join(report.tpu_devices) or 'none'}", highlight=False)
    console.print(f"  chip        {report.chip} ({report.chip_source})", highlight=False)
    console.print(
        f"  eager mode  {report.eager_mode} / {report.eager_mode_doc_name} ({report.eager_mode_source})",
        highlight=False,
    )
    graphs = report.graph_compiler
    console.print(
        f"  graphs      {graphs['name']} ({graphs['source']}; emulation only, for torch.compile and DeferAndFuse)",
        highlight=False,
    )
    compiler = report.tpu_compiler
    hint = f"; {compiler['hint']}" if compiler.get("hint") else ""
    console.print(
        f"  compiler    {escape(compiler['reason'] + ' (for estimate' + hint + ')')}", highlight=False, soft_wrap=True
    )
    surface = report.torch_tpu_surface
    console.print(f"  torch_tpu   {escape(surface['import_torch_tpu'])}", highlight=False, soft_wrap=True)
    console.print(f"  newest      {escape(surface['newest'])}", highlight=False, soft_wrap=True)
    console.print(f"  legacy APIs {escape(surface['legacy_device_apis'])}", highlight=False, soft_wrap=True)
    console.print(f"  autoload    {escape(surface['autoload'])}", highlight=False, soft_wrap=True)
    for name, value in report.env.items():
        console.print(f"  env         {name}={value}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``doctor`` to the root app."""
    app.command(
        "run",
        help=RUN_HELP,
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(run)
    app.command("doctor", help=DOCTOR_HELP)(doctor)
