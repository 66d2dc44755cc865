"""Markdown report: for pull requests and issues."""

from __future__ import annotations

from typing import Any

from tpu_agent.profile.report._common import (
    capture_warnings,
    estimate_lines,
    headline,
    human_bytes,
    location_text,
    verification_text,
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(data: dict[str, Any]) -> str:
    out = ["# tpu-agent profile report", "", headline(data), ""] + [f"> {w}" for w in capture_warnings(data)]
    out += ["## Findings", ""]
    if not data["findings"]:
        out += ["No findings.", ""]
    for f in data["findings"]:
        out += [
            f"### {f['rule_id']} ({f['severity']}): {f['title']}",
            "",
            f"- where: `{location_text(f)}`"
            + (f": `{f['locations'][0]['code']}`" if f["locations"] and f["locations"][0].get("code") else ""),
            f"- evidence: {f['evidence']['metric']} = {f['evidence']['value']} (threshold {f['evidence']['threshold']} "
            f"{f['evidence']['unit']})",
            f"- estimated saving: {f['estimated_saving_pct']:.1f}% of step, confidence {f['confidence']:.0%}",
            "",
            f["suggestion"],
            "",
        ]
        change = f.get("agent_change") or {}
        if change:
            out += [f"Change: {change['description']}", ""]
            if checked := verification_text(change):
                out += [checked, ""]
            if change.get("diff"):
                out += ["```diff", change["diff"].rstrip("\n"), "```", ""]
    steps = data["step_time"]
    if steps.get("count"):
        out += [
            "## Step time",
            "",
            f"median {steps['median_ms']:.3f} ms, min {steps['min_ms']:.3f} ms, max {steps['max_ms']:.3f} ms over "
            f"{steps['count']} steps",
            "",
        ]
    if data["ops"]:
        out += ["## Top ops", "", "| op | calls | total ms | share | dtypes |", "|---|---:|---:|---:|---|"]
        out += [
            f"| `{r['name']}` | {r['calls']} | {r['total_ms']:.3f} | {r['share']:.1%} | {_cell(','.join(r['dtypes']))} "
            "|"
            for r in data["ops"][:15]
        ]
        out.append("")
    memory = data["memory"]
    if "param_bytes" in memory:
        out += [
            "## Memory per device",
            "",
            f"params {human_bytes(memory['param_bytes'])}, grads {human_bytes(memory['grad_bytes'])}, optimizer "
            f"{human_bytes(memory['optimizer_bytes'])}, activations {human_bytes(memory['activation_bytes'])}; peak "
            f"{human_bytes(memory['peak_bytes'])} of {human_bytes(memory['hbm_bytes_per_device'])} HBM",
            "",
        ]
    out += ["## TPU estimate", ""] + estimate_lines(data["estimate"]) + [""]
    out += [f"- {a}" for a in data["estimate"].get("assumptions", [])] + [""]
    out += ["## Rules", "", "| rule | status | reason |", "|---|---|---|"]
    out += [f"| {r['rule_id']} | {r['status']} | {_cell(r['reason'])} |" for r in data["rules"]]
    return "\n".join(out) + "\n"
