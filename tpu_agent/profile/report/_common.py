"""Formatting helpers shared by the renderers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} TiB"


def where(location: dict[str, Any], show: Callable[[str], str] = str) -> str:
    """``file:line (function)`` for one location, its path as ``show`` gives it."""
    return f"{show(location['file'])}:{location['line']} ({location['function']})"


def verification_text(change: dict[str, Any]) -> str:
    """One sentence on whether the change's diff was checked (:mod:`tpu_agent.profile.verify`), or why the change
    is advice without a diff; empty when it never had a diff and gives no reason."""
    verification = change.get("verification")
    if not verification:
        reason = change.get("no_diff_reason")
        return f"Advice without a diff: {reason}." if reason else ""
    status, reason = verification["status"], verification["reason"]
    if status == "verified":
        measure = f"{verification['metric']} {verification['before']:g} -> {verification['after']:g}"
        return f"Verified ({measure}): {reason}."
    if status == "failed":
        return f"Not offered as a diff: it could not be verified ({reason})."
    return f"Unverified diff: {reason}."


def location_text(finding: dict[str, Any]) -> str:
    locations = finding.get("locations") or []
    return where(locations[0]) if locations else "-"


def estimate_lines(estimate: dict[str, Any]) -> list[str]:
    """The TPU estimate as sentences, always followed by its assumptions."""
    if not estimate.get("available"):
        return ["No TPU estimate: " + "; ".join(estimate.get("assumptions", []))]
    compiled = estimate.get("compiler")
    lines = []
    if compiled:
        mfu = "n/a" if compiled["mfu"] is None else f"{compiled['mfu']:.1%}"
        lines.append(
            f"TPU compiler (libtpu) on {compiled['target']}, {compiled['strategy']}: {compiled['verdict']}, "
            f"{human_bytes(compiled['peak_hbm_bytes_per_chip'])} of {human_bytes(compiled['hbm_bytes_per_chip'])} "
            f"HBM per chip, step {compiled['step_seconds'] * 1e3:.3f} ms (compiler's optimal), MFU {mfu}."
        )
    lines += [
        f"Roofline on {estimate['chip']}: {estimate['flops_per_step'] / 1e9:.3f} GFLOP and "
        f"{human_bytes(estimate['bytes_per_step'])} per step ({estimate['arithmetic_intensity']:.1f} FLOP/byte, "
        f"ridge {estimate['ridge_point']:.0f}: {estimate['bound']}-bound).",
        f"Step time estimate: eager {estimate['eager_step_s'] * 1e3:.3f} ms (MFU {estimate['eager_mfu']:.1%}), "
        f"fused/compiled {estimate['fused_step_s'] * 1e3:.3f} ms (MFU {estimate['fused_mfu']:.1%}).",
    ]
    return lines


def capture_warnings(data: dict[str, Any]) -> list[str]:
    return [f"capture warning: {w}" for w in data["capture"].get("warnings", [])]


def headline(data: dict[str, Any]) -> str:
    summary, capture, steps = data["summary"], data["capture"], data["step_time"]
    step_text = (
        f"median step {steps['median_ms']:.2f} ms over {steps['count']} steps"
        if steps.get("count")
        else "no steps measured"
    )
    return (
        f"{capture['script'] or capture['logdir']} on {capture['chip']} ({capture['source']}, "
        f"eager mode {capture['eager_mode'] or 'unknown'}): {step_text}; {summary['errors']} error(s), "
        f"{summary['warnings']} warning(s), {summary['infos']} info, {summary['insufficient_data']} rule(s) lacked data"
    )
