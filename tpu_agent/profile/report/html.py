"""HTML report: one self-contained file (inline CSS and SVG, no scripts, no network) for people.

Sections: summary, step time per step, host time by op, memory over time, findings with their code
changes, the TPU estimate with its assumptions, and every rule's outcome.
"""

from __future__ import annotations

from html import escape
from typing import Any

from tpu_agent.profile.report._common import (
    capture_warnings,
    estimate_lines,
    headline,
    human_bytes,
    location_text,
    verification_text,
)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#1d1d1f;padding:0 1em}
h1{font-size:1.6em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.sev-error{color:#b00020;font-weight:600}.sev-warning{color:#a05a00;font-weight:600}.sev-info{color:#00639b}
.finding{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;margin:.8em 0}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:.85em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
svg text{font-size:11px;font-family:inherit}.muted{color:#666;font-size:.9em}
"""
_W, _H, _PAD = 900, 220, 48


def _bar_chart(
    chart_id: str, title: str, values: list[float], labels: list[str], unit: str, highlight: list[bool]
) -> str:
    """Vertical bars, one per value. The axis fits the highlighted (measured) bars; taller ones are clipped
    and drawn hatched-red, so a start-up step of seconds does not flatten the steps that matter."""
    if not values:
        return f'<p id="{chart_id}" class="muted">{escape(title)}: no data.</p>'
    measured = [v for v, h in zip(values, highlight, strict=True) if h]
    top = (max(measured) * 1.25 if measured else max(values)) or 1.0
    width = (_W - 2 * _PAD) / len(values)
    bars = []
    for i, (value, label) in enumerate(zip(values, labels, strict=True)):
        h = (_H - 2 * _PAD) * min(value, top) / top
        x = _PAD + i * width
        fill = "#d93025" if value > top else "#1a73e8" if highlight[i] else "#b0c4de"
        bars.append(
            f'<rect x="{x:.1f}" y="{_H - _PAD - h:.1f}" width="{max(width - 1, 1):.1f}" height="{h:.1f}" fill="{fill}">'
            f"<title>{escape(label)}: {value:.3f} {escape(unit)}</title></rect>"
        )
    step_labels = "".join(
        f'<text x="{_PAD + i * width + width / 2:.1f}" y="{_H - _PAD + 14}" text-anchor="middle">{escape(label)}</text>'
        for i, label in enumerate(labels)
        if len(labels) <= 40 or i % max(len(labels) // 20, 1) == 0
    )
    return (
        f'<svg id="{chart_id}" role="img" aria-label="{escape(title)}" width="{_W}" height="{_H}" viewBox="0 0 {_W} '
        f'{_H}">'
        f'<text x="{_PAD}" y="16" font-weight="600">{escape(title)}</text>'
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#888"/>'
        f'<text x="{_PAD - 4}" y="{_PAD}" text-anchor="end">{top:.2f}</text><text x="{_PAD - 4}" y="{_H - _PAD}" '
        'text-anchor="end">0</text>'
        f'<text x="{_PAD - 4}" y="{_PAD + 14}" text-anchor="end">{escape(unit)}</text>'
        + "".join(bars)
        + step_labels
        + "</svg>"
    )


def _short(name: str, limit: int = 38) -> str:
    return name if len(name) <= limit else "..." + name[-(limit - 3) :]


def _op_chart(ops: list[dict[str, Any]]) -> str:
    rows = ops[:12]
    if not rows:
        return '<p id="op-chart" class="muted">Time by op: no op trace.</p>'
    height = 30 + 22 * len(rows)
    top = max(r["total_ms"] for r in rows) or 1.0
    bars = []
    for i, row in enumerate(rows):
        y = 24 + i * 22
        w = (_W - 360) * row["total_ms"] / top
        bars.append(
            f'<text x="250" y="{y + 13}" text-anchor="end">{escape(_short(row["name"]))}</text>'
            f'<rect x="256" y="{y}" width="{w:.1f}" height="16" fill="#34a853"><title>{escape(row["name"])}: '
            f"{row['total_ms']:.3f} ms</title></rect>"
            f'<text x="{262 + w:.1f}" y="{y + 13}">{row["total_ms"]:.2f} ms ({row["share"]:.0%})</text>'
        )
    return (
        f'<svg id="op-chart" role="img" aria-label="Host time by op" width="{_W}" height="{height}" viewBox="0 0 {_W} '
        f'{height}">'
        f'<text x="8" y="14" font-weight="600">Host time by op (measured steps)</text>' + "".join(bars) + "</svg>"
    )


def _memory_chart(memory: dict[str, Any]) -> str:
    points = memory.get("timeline") or []
    if len(points) < 2:
        return '<p id="memory-chart" class="muted">Memory over time: no memory trace.</p>'
    t0, t1 = points[0]["time_ns"], points[-1]["time_ns"]
    top = max(p["allocated_bytes"] for p in points) or 1
    span = (t1 - t0) or 1
    coords = " ".join(
        f"{_PAD + (_W - 2 * _PAD) * (p['time_ns'] - t0) / span:.1f},{_H - _PAD - (_H - 2 * _PAD) * p['allocated_bytes'] / top:.1f}"
        for p in points
    )
    return (
        f'<svg id="memory-chart" role="img" aria-label="Memory over time" width="{_W}" height="{_H}" viewBox="0 0 {_W} '
        f'{_H}">'
        f'<text x="{_PAD}" y="16" font-weight="600">Allocated memory over time</text>'
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#888"/>'
        f'<text x="{_PAD - 4}" y="{_PAD}" text-anchor="end">{escape(human_bytes(top))}</text>'
        f'<text x="{_W - _PAD}" y="{_H - _PAD + 14}" text-anchor="end">{(t1 - t0) / 1e6:.1f} ms</text>'
        f'<polyline fill="none" stroke="#ea4335" stroke-width="1.5" points="{coords}"/></svg>'
    )


def _finding_html(f: dict[str, Any]) -> str:
    change = f.get("agent_change") or {}
    evidence = f["evidence"]
    code = "".join(
        f'<pre class="source">{escape(loc["file"])}:{loc["line"]}\n    {escape(loc["code"])}</pre>'
        for loc in f["locations"][:3]
        if loc.get("code")
    )
    parts = [
        f'<div class="finding" data-rule="{escape(f["rule_id"])}">',
        f'<h3><span class="sev-{escape(f["severity"])}">{escape(f["severity"].upper())}</span> {escape(f["rule_id"])}: '
        f"{escape(f['title'])}</h3>",
        f"<p><b>Where:</b> <code>{escape(location_text(f))}</code> &middot; <b>Estimated saving:</b> "
        f"{f['estimated_saving_pct']:.1f}% of step &middot; <b>Confidence:</b> {f['confidence']:.0%}</p>",
        f"<p><b>Evidence:</b> {escape(evidence['metric'])} = {evidence['value']} (threshold {evidence['threshold']} "
        f"{escape(evidence['unit'])})</p>",
        code,
        f"<p>{escape(f['suggestion'])}</p>",
    ]
    if change:
        parts.append(f"<p><b>Change:</b> {escape(change['description'])}</p>")
        if checked := verification_text(change):
            parts.append(f"<p><i>{escape(checked)}</i></p>")
        if change.get("diff"):
            parts.append(f'<pre class="diff">{escape(change["diff"])}</pre>')
    parts.append("</div>")
    return "".join(parts)


def render_html(data: dict[str, Any]) -> str:
    steps = [s for s in data["steps"] if s["rank"] == (data["capture"]["ranks"] or [0])[0]]
    step_chart = _bar_chart(
        "step-chart",
        "Step time per step (dark: measured window; red: above the axis, clipped)",
        [s["duration_ms"] for s in steps],
        [str(s["index"]) for s in steps],
        "ms",
        [s["in_window"] for s in steps],
    )
    warnings = "".join(f'<p class="sev-warning">{escape(w)}</p>' for w in capture_warnings(data))
    findings = "".join(_finding_html(f) for f in data["findings"]) or "<p>No findings.</p>"
    estimate = "".join(f"<p>{escape(line)}</p>" for line in estimate_lines(data["estimate"]))
    assumptions = "".join(f"<li>{escape(a)}</li>" for a in data["estimate"].get("assumptions", []))
    rules = "".join(
        f"<tr><td>{escape(r['rule_id'])}</td><td>{escape(r['status'])}</td><td>{escape(r['reason'])}</td></tr>"
        for r in data["rules"]
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>tpu-agent profile report</title><style>{_CSS}</style></head><body>"
        f'<h1>tpu-agent profile report</h1><p id="headline">{escape(headline(data))}</p>{warnings}'
        f'<h2>Findings</h2><section id="findings">{findings}</section>'
        f"<h2>Step time</h2>{step_chart}"
        f"<h2>Time by op</h2>{_op_chart(data['ops'])}"
        f"<h2>Memory</h2>{_memory_chart(data['memory'])}"
        f'<h2>TPU estimate</h2><section id="estimate">{estimate}<ul class="muted">{assumptions}</ul></section>'
        f'<h2>Rules</h2><table id="rules"><tr><th>rule</th><th>status</th><th>reason</th></tr>{rules}</table>'
        "</body></html>\n"
    )
