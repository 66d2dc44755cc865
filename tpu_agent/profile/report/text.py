"""Terminal report: rich tables, findings ranked as the engine ranked them (capture, severity, saving).

A finding's fix can be a paragraph plus a multi-line diff; squeezed into a table cell at 80 columns it folds
into unreadable fragments. So the table holds one short row per finding (number, rule, severity, summary,
location, saving) and each fix follows it as a full-width block under its number, with the diff highlighted
and its lines intact.
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from tpu_agent.profile.patches import display_path
from tpu_agent.profile.report._common import (
    capture_warnings,
    estimate_lines,
    headline,
    human_bytes,
    verification_text,
    where,
)

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _where(location: dict[str, Any]) -> str:
    return where(location, display_path)


def _findings_table(findings: list[dict[str, Any]]) -> Table:
    """One short row per finding; the fixes, which can be long and multi-line, follow the table (see _fix)."""
    table = Table(title="Findings", expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("rule", no_wrap=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("finding", ratio=3, overflow="fold")
    table.add_column("where", ratio=2, overflow="fold")
    table.add_column("saving", justify="right", no_wrap=True)
    for number, f in enumerate(findings, start=1):
        table.add_row(
            str(number),
            f["rule_id"],
            Text(f["severity"], style=_STYLE[f["severity"]]),
            f["title"],
            _where(f["locations"][0]) if f["locations"] else "-",
            f"{f['estimated_saving_pct']:.1f}%",
        )
    return table


class DiffBlock:
    """A diff, highlighted, one screen line per diff line where it fits. A longer line is wrapped with each
    continuation marked ``↳`` (a character no diff line starts with), so it is neither cropped nor mistaken for
    a line of its own; the JSON report keeps the diff as ``git apply`` takes it."""

    def __init__(self, diff: str) -> None:
        self.diff = diff

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        highlighted = Syntax(self.diff, "diff", theme="ansi_dark", background_color="default").highlight(self.diff)
        highlighted.rstrip()
        width = options.max_width
        for line in highlighted.split("\n"):
            if line.cell_len <= width:
                yield _unwrapped(line)
                continue
            for index, piece in enumerate(line.wrap(console, max(width - len(CONTINUATION), 8), overflow="fold")):
                yield _unwrapped(Text(CONTINUATION, style="dim") + piece if index else piece)


CONTINUATION = "↳ "


def _unwrapped(line: Text) -> Text:
    line.no_wrap, line.end = True, "\n"
    return line


def _fix(number: int, f: dict[str, Any]) -> Group:
    """A finding's fix as a block of its own, full width: header with file:line, advice, the change, its diff."""
    header = Text.assemble(
        (f"[{number}] ", "bold"),
        (f["rule_id"], f"bold {_STYLE[f['severity']]}"),
        (f" {f['name']}", "bold"),
        (f" at {_where(f['locations'][0])}" if f["locations"] else "", "bold"),
    )
    parts: list[RenderableType] = [header, Text(f["suggestion"])]
    change = f.get("agent_change") or {}
    if change.get("description") and change["description"] not in f["suggestion"]:
        parts.append(Text("Change: " + change["description"]))
    if len(f["locations"]) > 1:
        parts.append(Text("Also at: " + "; ".join(_where(loc) for loc in f["locations"][1:]), style="dim"))
    checked = verification_text(change)
    if checked:
        parts.append(Text(checked, style="green" if change.get("verified") else "yellow"))
    if change.get("diff"):
        parts.append(DiffBlock(change["diff"]))
    return Group(*parts, Text(""))


def renderables(data: dict[str, Any]) -> list[RenderableType]:
    """The report as rich renderables (the CLI prints them with colour)."""
    parts: list[RenderableType] = [Text(headline(data), style="bold")]
    parts += [Text(line, style="yellow") for line in capture_warnings(data)]
    if data["findings"]:
        parts.append(_findings_table(data["findings"]))
        parts += [_fix(number, f) for number, f in enumerate(data["findings"], start=1)]
    else:
        parts.append(Text("No findings.", style="green"))
    steps = data["step_time"]
    if steps.get("count"):
        parts.append(
            Text(
                f"Step time: median {steps['median_ms']:.3f} ms, min {steps['min_ms']:.3f}, max {steps['max_ms']:.3f} "
                f"({steps['count']} steps)"
            )
        )
    ops = Table(title="Top ops in the measured steps (host time)")
    for column in ("op", "calls", "total ms", "share", "dtypes"):
        ops.add_column(column)
    for row in data["ops"][:10]:
        ops.add_row(
            row["name"], str(row["calls"]), f"{row['total_ms']:.3f}", f"{row['share']:.1%}", ",".join(row["dtypes"])
        )
    if data["ops"]:
        parts.append(ops)
    memory = data["memory"]
    if "param_bytes" in memory:
        parts.append(
            Text(
                f"Memory per device: params {human_bytes(memory['param_bytes'])}, grads "
                f"{human_bytes(memory['grad_bytes'])}, "
                f"optimizer {human_bytes(memory['optimizer_bytes'])}, activations "
                f"{human_bytes(memory['activation_bytes'])}, "
                f"peak {human_bytes(memory['peak_bytes'])} of {human_bytes(memory['hbm_bytes_per_device'])} HBM"
            )
        )
    estimate = data["estimate"]
    parts.append(Text("\n".join(estimate_lines(estimate)), style="bold"))
    if estimate.get("available"):
        parts.append(Text("Assumptions: " + "; ".join(estimate["assumptions"]), style="dim"))
    lacking = [r for r in data["rules"] if r["status"] == "insufficient_data"]
    if lacking:
        parts.append(
            Text("Not enough data for: " + "; ".join(f"{r['rule_id']} ({r['reason']})" for r in lacking), style="dim")
        )
    if data["capture"]["xplane_files"]:
        parts.append(
            Text("XProf: tensorboard --logdir " + data["capture"]["logdir"] + "  (or: xprof --logdir ...)", style="dim")
        )
    return parts


def render_text(data: dict[str, Any], width: int = 140) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True, highlight=False).print(Group(*renderables(data)))
    return buffer.getvalue()
