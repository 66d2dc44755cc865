"""Renderers of an estimate: Markdown here, rich tables in the CLI, ``--format json`` the document itself.

Every renderer reads the JSON form (:meth:`CompiledEstimate.to_dict`, documented in docs/estimate-json-schema.md),
because that is what crosses the process boundary from the capture child and what MCP clients receive; one
row builder serves every renderer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpu_agent.estimate.model import CompiledEstimate


def human_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def _as_dict(estimate: CompiledEstimate | dict[str, Any]) -> dict[str, Any]:
    return estimate.to_dict() if isinstance(estimate, CompiledEstimate) else estimate


def memory_rows(estimate: CompiledEstimate | dict[str, Any]) -> list[tuple[str, str]]:
    """HBM per chip by kind for the step's largest program, then the total against the chip's HBM."""
    data = _as_dict(estimate)
    if not data["programs"]:
        return []
    peak = max(data["programs"], key=lambda program: program["memory"]["total"])
    memory = peak["memory"]
    rows = [(kind.replace("_", " "), human_bytes(value)) for kind, value in memory.items() if kind != "total"]
    rows.append(("total per chip", f"{human_bytes(memory['total'])} of {human_bytes(data['hbm_bytes_per_chip'])}"))
    return rows


def summary_rows(estimate: CompiledEstimate | dict[str, Any]) -> list[tuple[str, str]]:
    """The headline figures: verdict, compute, time and MFU, collectives and fusions."""
    data = _as_dict(estimate)
    mfu = "n/a" if data["mfu"] is None else f"{data['mfu']:.1%}"
    programs = data["programs"]
    collectives = sum(program["hlo"]["collective_bytes"] * program.get("calls", 1) for program in programs)
    kinds = sorted({kind for program in programs for kind in program["hlo"]["collectives"]})
    share = data.get("step_ops_share", 1.0)
    part = "" if share >= 1.0 else f" (PARTIAL: {share:.0%} of the step's ops)"
    return [
        ("target", f"{data['target']} ({data['chips']} x {data['chip']}, {data['strategy']} sharding)"),
        ("verdict", data["verdict"] + part),
        (
            "peak HBM per chip",
            f"{human_bytes(data['peak_hbm_bytes_per_chip'])} of {human_bytes(data['hbm_bytes_per_chip'])}{part}",
        ),
        (
            "largest HBM uses",
            ", ".join(
                f"{item['kind'].replace('_', ' ')} {human_bytes(item['bytes'])}" for item in data["largest_memory"]
            )
            or "none",
        ),
        ("FLOPs per chip per step", f"{data['flops_per_chip_per_step']:.3e}{part}"),
        ("step time (compiler's optimal, uncalibrated)", f"{data['step_seconds'] * 1e3:.3f} ms{part}"),
        ("MFU at that time", mfu + part),
        *_calibrated_rows(data.get("calibrated")),
        ("collectives per chip per step", f"{human_bytes(collectives)} ({', '.join(kinds) or 'none'})"),
        ("fusions", str(sum(program["hlo"]["fusions"] for program in programs))),
        ("compiler", data["compiler"]),
    ]


def _calibrated_rows(calibrated: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The calibrated step time with its band, source and MFU, or why there is none."""
    if not calibrated:
        reason = "none: the step does not fit, or no published TPU run calibrates the compiler's time yet"
        return [("step time (calibrated)", reason)]
    calibration = calibrated["calibration"]
    mfu = "n/a" if calibrated["mfu"] is None else f"{calibrated['mfu']:.1%}"
    return [
        (
            "step time (calibrated)",
            f"{calibrated['seconds'] * 1e3:.1f} ms (band {calibrated['low_seconds'] * 1e3:.1f} to "
            f"{calibrated['high_seconds'] * 1e3:.1f} ms: x{calibration['factor']:.2f}, the ratio of measured to "
            f"estimated time over {len(calibration['runs'])} published run(s) of a {calibration['kind']}; "
            f"{', '.join(calibrated['sources'])}; {calibrated['note']})",
        ),
        ("MFU at the calibrated time", mfu),
    ]


PROGRAM_COLUMNS = ("program", "runs/step", "FLOPs", "bytes accessed", "optimal time", "HBM", "compiler")


def program_rows(estimate: CompiledEstimate | dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per compiled program of the step."""
    return [
        (
            program["name"],
            str(program.get("calls", 1)),
            f"{program['flops']:.3e}",
            human_bytes(program["bytes_accessed"]),
            f"{program['optimal_seconds'] * 1e3:.3f} ms",
            human_bytes(program["memory"]["total"]),
            program["refused"] or "compiled",
        )
        for program in _as_dict(estimate)["programs"]
    ]


SUGGESTION_COLUMNS = ("change", "target", "fits", "HBM per chip", "step time")


def suggestion_rows(estimate: CompiledEstimate | dict[str, Any]) -> list[tuple[str, ...]]:
    """Each change that was compiled to see whether the step then fits."""
    return [
        (
            suggestion["change"],
            suggestion["target"],
            ("yes" if suggestion["fits"] else "no") if suggestion.get("verified", True) else "unverified",
            human_bytes(suggestion["peak_hbm_bytes"]) if suggestion.get("verified", True) else "-",
            f"{suggestion['step_seconds'] * 1e3:.3f} ms" if suggestion.get("verified", True) else "-",
        )
        for suggestion in _as_dict(estimate)["suggestions"]
    ]


def _table(columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(row) + " |" for row in rows
    ]


def to_markdown(estimate: CompiledEstimate | dict[str, Any]) -> str:
    """A Markdown report: summary, memory, programs, suggestions (checked by compiling) and assumptions."""
    data = _as_dict(estimate)
    lines = [f"# TPU estimate: {data['target']}", ""] + _table(("", ""), summary_rows(data))
    lines += ["", "## HBM per chip (largest program)", ""] + _table(("kind", "bytes"), memory_rows(data))
    lines += ["", "## Programs", ""] + _table(PROGRAM_COLUMNS, program_rows(data))
    if data["suggestions"]:
        lines += ["", "## What would fit (compiled unless marked unverified)", ""] + _table(
            SUGGESTION_COLUMNS, suggestion_rows(data)
        )
    lines += ["", "## Assumptions", ""] + [f"- {assumption}" for assumption in data["assumptions"]]
    return "\n".join(lines) + "\n"
