"""Renderers of an :class:`~tpu_agent.estimate.model.Estimate`: Markdown here; the CLI draws the same rows with
rich and ``--format json`` prints :meth:`Estimate.to_dict`. One row builder serves every renderer."""

from __future__ import annotations

from tpu_agent.estimate.model import Estimate


def human_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def memory_rows(estimate: Estimate) -> list[tuple[str, str]]:
    """HBM per chip by kind for the step's largest program, then the total against the chip's HBM."""
    if not estimate.programs:
        return []
    peak = max(estimate.programs, key=lambda program: program.memory.total)
    rows = [
        (kind.replace("_", " "), human_bytes(value)) for kind, value in peak.memory.to_dict().items() if kind != "total"
    ]
    rows.append(("total per chip", f"{human_bytes(peak.memory.total)} of {human_bytes(estimate.hbm_bytes_per_chip)}"))
    return rows


def summary_rows(estimate: Estimate) -> list[tuple[str, str]]:
    """The headline figures: verdict, compute, time and MFU, collectives and fusions."""
    mfu = "n/a" if estimate.mfu is None else f"{estimate.mfu:.0%}"
    collectives = sum(program.hlo.collective_bytes for program in estimate.programs)
    return [
        ("target", f"{estimate.target} ({estimate.chips} x {estimate.chip_name}, {estimate.strategy} sharding)"),
        ("verdict", "fits" if estimate.fits else "does not fit"),
        ("FLOPs per chip per step", f"{estimate.flops_per_chip:.3e}"),
        ("step time (compiler's optimal)", f"{estimate.step_seconds * 1e3:.3f} ms"),
        ("MFU at that time", mfu),
        ("collective bytes per chip per step", human_bytes(collectives)),
        ("fusions", str(sum(program.hlo.fusions for program in estimate.programs))),
        ("compiler", estimate.compiler),
    ]


def to_markdown(estimate: Estimate) -> str:
    """A Markdown report: summary, memory, programs, suggestions (checked by compiling) and assumptions."""
    lines = [f"# TPU estimate: {estimate.target}", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in summary_rows(estimate)]
    lines += ["", "## HBM per chip", "", "| kind | bytes |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in memory_rows(estimate)]
    lines += [
        "",
        "## Programs",
        "",
        "| program | FLOPs | bytes accessed | optimal time | HBM | compiler |",
        "|---|---|---|---|---|---|",
    ]
    for program in estimate.programs:
        lines.append(
            f"| {program.name} | {program.flops:.3e} | {human_bytes(program.bytes_accessed)} | "
            f"{program.optimal_seconds * 1e3:.3f} ms | {human_bytes(program.memory.total)} | {program.refused or 'compiled'} |"
        )
    if estimate.suggestions:
        lines += [
            "",
            "## What would fit (each compiled)",
            "",
            "| change | target | fits | HBM per chip |",
            "|---|---|---|---|",
        ]
        for suggestion in estimate.suggestions:
            fits = "yes" if suggestion.fits else "no"
            lines.append(
                f"| {suggestion.change} | {suggestion.target} | {fits} | {human_bytes(suggestion.peak_hbm_bytes)} |"
            )
    lines += ["", "## Assumptions", ""] + [f"- {assumption}" for assumption in estimate.assumptions]
    return "\n".join(lines) + "\n"
