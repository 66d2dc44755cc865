"""The JSON report document (schema in docs/profile-json-schema.md) that every renderer reads.

Built once per complete :class:`~tpu_agent.profile.model.Diagnosis`: the capture's configuration, step
statistics, the op table, memory, the estimate, findings and per-rule outcomes.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from tpu_agent import __version__
from tpu_agent.profile.model import Diagnosis, Op, ProfileModel, Severity, Status

SCHEMA_VERSION = 1
OP_TABLE_ROWS = 25
MEMORY_TIMELINE_POINTS = 400


def _ms(ns: float) -> float:
    return round(ns / 1e6, 4)


def op_table(model: ProfileModel, limit: int = OP_TABLE_ROWS) -> list[dict[str, Any]]:
    """The window's top-level ops grouped by name, busiest first: calls, time, share, FLOPs, dtypes, shapes."""
    rank = model.primary
    steps = {s.index for s in rank.steps_in_window()}
    groups: dict[str, list[Op]] = defaultdict(list)
    for op in rank.ops:
        if op.top_level and op.step in steps:
            groups[op.name].append(op)
    total = sum(op.duration_ns for ops in groups.values() for op in ops) or 1
    kernel_flops: dict[str, float] = defaultdict(float)
    for op in rank.ops:
        if op.costed and op.step in steps:
            kernel_flops[op.name] += op.flops
    rows = []
    for name, ops in sorted(groups.items(), key=lambda item: -sum(o.duration_ns for o in item[1]))[:limit]:
        shapes: dict[str, int] = defaultdict(int)
        for op in ops:
            shapes[str(op.input_shapes)] += 1
        rows.append(
            {
                "name": name,
                "calls": len(ops),
                "total_ms": _ms(sum(o.duration_ns for o in ops)),
                "share": round(sum(o.duration_ns for o in ops) / total, 4),
                "flops": kernel_flops.get(name, 0.0),
                "dtypes": sorted({t for o in ops for t in o.input_dtypes if t and t not in ("Scalar", "ScalarList")}),
                "top_shapes": [s for s, _ in sorted(shapes.items(), key=lambda kv: -kv[1])[:3]],
            }
        )
    return rows


def memory_stats(model: ProfileModel) -> dict[str, Any]:
    """HBM per device, a thinned allocation timeline and, when measured, the model-state breakdown."""
    rank = model.primary
    timeline = rank.memory_timeline
    stride = max(len(timeline) // MEMORY_TIMELINE_POINTS, 1)
    data: dict[str, Any] = {
        "hbm_bytes_per_device": model.config.chip.hbm_bytes_per_device,
        "timeline": [{"time_ns": p.time_ns, "allocated_bytes": p.allocated_bytes} for p in timeline[::stride]],
    }
    if rank.memory is not None:
        m = rank.memory
        data.update(
            param_bytes=m.param_bytes,
            grad_bytes=m.grad_bytes,
            optimizer_bytes=m.optimizer_bytes,
            activation_bytes=m.activation_bytes,
            peak_bytes=m.peak_bytes,
        )
    return data


def step_stats(model: ProfileModel) -> dict[str, Any]:
    """Count, median, mean, min and max step time over the measured window."""
    durations = [s.duration_ns for s in model.primary.steps_in_window()]
    if not durations:
        return {"count": 0}
    return {
        "count": len(durations),
        "median_ms": _ms(statistics.median(durations)),
        "mean_ms": _ms(statistics.fmean(durations)),
        "min_ms": _ms(min(durations)),
        "max_ms": _ms(max(durations)),
    }


def build_document(diagnosis: Diagnosis) -> dict[str, Any]:
    """The stable JSON document every renderer reads."""
    model = diagnosis.model
    config = model.config
    window = model.primary.steps_in_window()
    counts = {s.value: sum(1 for f in diagnosis.findings if f.severity == s) for s in Severity}
    return _json_safe(
        {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "tpu-agent", "version": __version__},
            "capture": {
                "logdir": str(diagnosis.logdir),
                "source": config.source,
                "script": config.script,
                "exit_code": diagnosis.exit_code,
                "chip": config.chip.key,
                "eager_mode": config.eager_mode,
                "backend": config.backend,
                "world_size": config.world_size,
                "ranks": sorted(model.ranks),
                "requested_steps": config.requested_steps,
                "requested_warmup": config.requested_warmup,
                "window": {"first_step": window[0].index, "last_step": window[-1].index} if window else None,
                "xplane_files": [str(p) for p in diagnosis.xplane_paths],
                "warnings": sorted({w for r in model.ranks.values() for w in r.warnings}),
                "losses": list(model.primary.losses),
            },
            "verification": diagnosis.verification,
            "step_time": step_stats(model),
            "steps": [
                {
                    "rank": r.rank,
                    "index": s.index,
                    "start_ns": s.start_ns,
                    "duration_ms": _ms(s.duration_ns),
                    "in_window": s in r.steps_in_window(),
                    "peak_bytes": r.step_peaks.get(s.index),
                }
                for r in model.ranks.values()
                for s in r.steps
            ],
            "ops": op_table(model),
            "memory": memory_stats(model),
            "estimate": diagnosis.estimate.to_dict(),
            "summary": {
                "errors": counts["error"],
                "warnings": counts["warning"],
                "infos": counts["info"],
                "insufficient_data": sum(1 for o in diagnosis.outcomes if o.status == Status.insufficient_data),
            },
            "findings": [f.to_dict() for f in diagnosis.findings],
            "rules": [o.to_dict() for o in diagnosis.outcomes],
        }
    )


def _json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity made ``None``: JSON has no such numbers (``json.dumps`` writes a bare
    ``NaN`` that other parsers reject), and a script's loss can be one."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
