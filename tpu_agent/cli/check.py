"""CLI command ``check`` over :func:`tpu_agent.check.check_model` (argument parsing and rendering only)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from tpu_agent.check.api import DEFAULT_MAX_PARAMETERS, DEFAULT_TIMEOUT_S, MIN_TIMEOUT_S
from tpu_agent.cli._options import Compiler, chip_option, compiler_option
from tpu_agent.cli._output import (
    FORMAT_HELP,
    OutputFormat,
    console,
    console_err,
    handles_errors,
    print_json,
)
from tpu_agent.errors import TpuAgentError
from tpu_agent.fsutil import atomic_write_text

CHECK_HELP = """Validate a model on the TorchTPU 'tpu' device: forward + backward on CPU and on 'tpu' in Strict,
DeferAndFuse and torch.compile(backend="tpu"), outputs and gradients compared at matmul precision "highest";
on a mismatch or error, the first diverging submodule and the op inside it.

MODEL is a Hugging Face model type (built from a tiny config derived from transformers' own config class,
random weights, no download), a local model directory (config.json, plus safetensors or .bin weights when
present; its code is never run), or MODULE:FUNCTION / file.py:FUNCTION returning (model, inputs).

Exit code 0 when every mode matches, 1 on a mismatch or error, 2 on bad arguments.

Examples:

  tpu-agent check llama

  tpu-agent check t5 --mode strict --mode compile

  tpu-agent check llama --compiler xla            # DeferAndFuse and compiled graphs through XLA

  tpu-agent check ./my-model-dir --format json

  tpu-agent check mypkg.models:make_model_and_inputs

  tpu-agent check bert --task masked-lm --timeout 300

  tpu-agent check gpt2 --output check.json        # the table here, the JSON report in check.json
"""

_COMPILER_TEXT = {"xla": "compiled by XLA", "eager": "run op by op"}
STATUS_STYLE = {"pass": "green", "mismatch": "yellow", "error": "red"}


def _mode_row(result: dict[str, Any]) -> tuple[str, str, str]:
    status = result["status"]
    style = STATUS_STYLE.get(status, "white")
    if result["error"]:
        error = result["error"]
        finding = f"{error['stage']}: {error['type']}: {error['message'].splitlines()[0]}"
        if error["location"]:
            finding += f" ({error['location']})"
    elif result["mismatches"]:
        first = result["mismatches"][0]
        finding = f"{len(result['mismatches'])} tensor(s) differ; first {first['name']}: " + (
            first["problem"] or f"max err {first['max_abs_err']:.3g} > allowed {first['allowed']:.3g}"
        )
    else:
        worst = [w for w in (result["worst_output"], result["worst_gradient"]) if w]
        finding = f"{result['outputs_checked']} outputs, {result['gradients_checked']} gradients match" + (
            f"; max err {max(w['max_abs_err'] for w in worst):.3g}" if worst else ""
        )
    return result["mode"], f"[{style}]{status}[/]", finding


def _render_text(report: dict[str, Any]) -> None:
    model = report["model"]
    console.print(
        f"[bold]{model['spec']}[/] ({model['name'] or model['kind']}{', ' + model['task'] if model['task'] else ''}; "
        f"{model['parameters']:,} parameters, {model['weights']}) on the {report['backend']} tpu backend, "
        f"matmul precision {report['matmul_precision']}"
        + (f", graphs {_COMPILER_TEXT[report['compiler']]}" if report.get("compiler") else ""),
        highlight=False,
    )
    table = Table(show_lines=False)
    table.add_column("mode")
    table.add_column("result")
    table.add_column("details", overflow="fold")
    for result in report["modes"]:
        table.add_row(*_mode_row(result))
    console.print(table)
    for result in report["modes"]:
        where = result["localisation"]
        if not where:
            continue
        console.print(
            f"[bold]{result['mode']}[/]: {where['kind']} diverges first in [bold]{where['module'] or '(model)'}[/] ({where['module_type']})",
            highlight=False,
        )
        if where["detail"]:
            console.print(f"  {where['detail']}", highlight=False)
        if where["op"]:
            at = f" at {where['op_location']}" if where["op_location"] else ""
            console.print(f"  first op: [bold]{where['op']}[/]{at}: {where['op_detail']}", highlight=False)
        if where["note"]:
            console.print(f"  note: {where['note']}", highlight=False)
    float32 = report["tolerances"].get("float32", {})
    xla_modes = [result["mode"] for result in report["modes"] if result.get("through_xla")]
    xla_float32 = report["xla_tolerances"].get("float32", {})
    through_xla = (
        f"; {', '.join(xla_modes)} ran through XLA, which reorders sums: float32 rtol {xla_float32.get('rtol')}, "
        f"atol {xla_float32.get('atol')}, torch's bound for compiled graphs"
        if xla_modes
        else ""
    )
    console.print(
        f"[dim]pass: per tensor, max|tpu - cpu| <= atol + rtol * max|cpu| (float32: rtol {float32.get('rtol')}, "
        f"atol {float32.get('atol')}{through_xla}; integers exact). --format json has every dtype's tolerance.[/]",
        highlight=False,
    )


@handles_errors
def check(
    model: str = typer.Argument(..., metavar="MODEL", help="HF model type, model directory, or MODULE:FUNCTION."),
    mode: list[str] = typer.Option(
        [], "--mode", "-m", help="strict | defer-and-fuse | compile (repeatable; default: all three)."
    ),
    task: str | None = typer.Option(
        None,
        "--task",
        help="HF task class: causal-lm, masked-lm, seq2seq, image-classification, base (default: the first the type has).",
    ),
    backend: str = typer.Option(
        "auto", "--backend", help="auto: real torch_tpu when it sees a TPU, else the emulation."
    ),
    chip: str | None = chip_option(None),
    timeout: float = typer.Option(
        DEFAULT_TIMEOUT_S,
        "--timeout",
        min=MIN_TIMEOUT_S,
        help="Seconds each mode may take (a mode past it is an error).",
    ),
    max_params: int = typer.Option(
        DEFAULT_MAX_PARAMETERS, "--max-params", min=1, help="Refuse a model directory describing a larger model."
    ),
    localise: bool = typer.Option(True, "--localise/--no-localise", help="On a divergence, find the submodule and op."),
    compiler: Compiler | None = compiler_option(),
    output_format: OutputFormat = typer.Option(OutputFormat.text, "--format", help=FORMAT_HELP),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Also write the JSON report to this file (atomically; stdout is unchanged)."
    ),
) -> None:
    from tpu_agent.check import CheckOptions, check_model, parse_model_spec

    if output_format not in (OutputFormat.text, OutputFormat.json):
        raise TpuAgentError(
            "bad-format", f"check prints text or json, not {output_format.value}", "use --format text or --format json"
        )
    options = CheckOptions(
        backend=backend,
        chip=chip,
        timeout_s=timeout,
        max_parameters=max_params,
        localise=localise,
        compiler=compiler.value if compiler is not None else None,
    )
    if mode:
        options = dataclasses.replace(options, modes=tuple(dict.fromkeys(mode)))
    spec = parse_model_spec(model, task)
    with console_err.status(f"checking {model}...") as status:
        report = check_model(spec, options, progress=lambda message: status.update(message))
    data = report.to_dict()
    if output is not None:
        atomic_write_text(output, json.dumps(data, indent=2) + "\n")
    if output_format == OutputFormat.json:
        print_json(data)
    else:
        _render_text(data)
    raise typer.Exit(int(report.exit_code))


def register(app: typer.Typer) -> None:
    """Add ``check`` to the root app."""
    app.command("check", help=CHECK_HELP)(check)
