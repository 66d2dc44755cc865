"""Terminal report: rich tables, findings ranked as the engine ranked them (capture, severity, saving)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from tpu_agent.profile.report._common import capture_warnings, estimate_lines, headline, human_bytes, location_text

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def renderables(data: dict[str, Any]) -> list[RenderableType]:
    """The report as rich renderables (the CLI prints them with colour)."""
    parts: list[RenderableType] = [Text(headline(data), style="bold")]
    parts += [Text(line, style="yellow") for line in capture_warnings(data)]
    findings = Table(title="Findings", show_lines=True, expand=True)
    for column in ("rule", "severity", "finding", "where", "saving", "fix"):
        findings.add_column(column, overflow="fold")
    for f in data["findings"]:
        fix = f["suggestion"]
        change = f.get("agent_change") or {}
        if change.get("diff"):
            fix += "\n" + change["diff"]
        findings.add_row(
            f["rule_id"],
            Text(f["severity"], style=_STYLE[f["severity"]]),
            f["title"],
            location_text(f),
            f"{f['estimated_saving_pct']:.1f}%",
            fix,
        )
    parts.append(findings if data["findings"] else Text("No findings.", style="green"))
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
