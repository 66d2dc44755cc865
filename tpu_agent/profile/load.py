"""Build the :class:`~tpu_agent.profile.model.ProfileModel` from what a capture left on disk.

Two inputs, one model:

* our raw directory (``<logdir>/tpu-agent/raw``): the runtime event log, the Kineto trace and the
  capture record per rank, plus ``options.json`` from the parent;
* a foreign XSpace (TorchTPU, JAX): :mod:`tpu_agent.profile.xplane` reads steps and ops from it; the data
  only our hooks record (call sites, DataLoader, weights) is then absent and rules needing it say so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tpu_agent.chips import DEFAULT_CHIP, get_chip
from tpu_agent.errors import TpuAgentError
from tpu_agent.profile import kineto
from tpu_agent.profile.capture import CAPTURE_FILE, TRACE_FILE
from tpu_agent.profile.model import (
    DataLoaderInfo,
    DataWait,
    MemoryBreakdown,
    MemoryPoint,
    ProfileModel,
    RankProfile,
    RunConfig,
    Step,
    Weight,
)
from tpu_agent.runtime import events as ev

OPTIONS_FILE = "options.json"
REPORT_DIR = "tpu-agent"
RAW_DIR = "raw"


def raw_dir(logdir: Path) -> Path:
    """Where a capture keeps its raw files: next to ``plugins/``, never inside an XProf session."""
    return logdir / REPORT_DIR / RAW_DIR


def _site(data: dict[str, Any] | None) -> ev.Site | None:
    return ev.Site(**data) if data else None


def steps_from_markers(events: list[ev.Event]) -> list[Step]:
    """Pair begin/end :class:`StepMarker` records into steps; duplicate markers for a step collapse."""
    begins: dict[int, tuple[int, str]] = {}
    ends: dict[int, tuple[int, str]] = {}
    for event in events:
        if isinstance(event, ev.StepMarker) and event.step is not None:
            table = begins if event.phase == "begin" else ends
            table.setdefault(event.step, (event.time_ns, event.source))
    steps: list[Step] = []
    previous_end: int | None = None
    for index in sorted(ends):
        end_ns, source = ends[index]
        start_ns = begins.get(index, (previous_end if previous_end is not None else end_ns, source))[0]
        steps.append(Step(index=index, start_ns=start_ns, end_ns=end_ns, source=source))
        previous_end = end_ns
    return steps


def _assign_steps(rank: RankProfile) -> None:
    """``op.step`` for every op: one walk over ops and steps, both sorted by start (what ``step_of`` answers)."""
    steps = sorted(rank.steps, key=lambda s: s.start_ns)
    index = 0
    for op in rank.ops:
        while index < len(steps) and op.start_ns >= steps[index].end_ns:
            index += 1
        op.step = steps[index].index if index < len(steps) and op.start_ns >= steps[index].start_ns else None


def _memory(rank: RankProfile, state: dict[str, int] | None) -> MemoryBreakdown | None:
    """Memory from the runtime's per-step samples (timeline, peak per step) and the measured model state."""
    samples = [e for e in rank.events if isinstance(e, ev.MemorySample)]
    for sample in samples:
        if sample.step is not None:
            rank.step_peaks[sample.step] = max(rank.step_peaks.get(sample.step, 0), sample.peak_bytes)
    window = {s.index for s in rank.steps_in_window()}
    peak = max((s.peak_bytes for s in samples if s.step is None or not window or s.step in window), default=0)
    if samples:
        rank.memory_timeline = [MemoryPoint(s.time_ns, s.allocated_bytes) for s in samples]
        rank.has_memory_trace = True
    if state is None:
        return None
    resident = state["param_bytes"] + state["grad_bytes"] + state["optimizer_bytes"]
    return MemoryBreakdown(
        param_bytes=state["param_bytes"],
        grad_bytes=state["grad_bytes"],
        optimizer_bytes=state["optimizer_bytes"],
        activation_bytes=max(peak - resident, 0) if rank.has_memory_trace else 0,
        peak_bytes=max(peak, resident),
    )


def _load_rank(directory: Path, rank_id: int, events: list[ev.Event]) -> RankProfile:
    rank = RankProfile(rank=rank_id, events=events)
    rank.steps = steps_from_markers(events)
    record_path = directory / CAPTURE_FILE.format(rank=rank_id)
    record: dict[str, Any] = json.loads(record_path.read_text(encoding="utf-8")) if record_path.exists() else {}
    if record:
        rank.host = record.get("host", rank.host)
        first, last = record["window"]
        rank.window = (first, last)
        rank.step_site = _site(record.get("step_site"))
        rank.forward_site = _site(record.get("forward_site"))
        rank.module_types = list(record.get("module_types", []))
        rank.weights = [
            Weight(w["module"], w["module_type"], tuple(w["shape"]), w["dtype"], _site(w.get("site"))) for w in record.get("weights", [])
        ]
        rank.dataloaders = [
            DataLoaderInfo(d["batch_size"], d["num_workers"], d["drop_last"], d["dataset_len"], _site(d.get("site")))
            for d in record.get("dataloaders", [])
        ]
        rank.warnings.extend(record.get("warnings", []))
        rank.data_waits = [DataWait(w["step"], w["duration_ns"], _site(w.get("site")), w["time_ns"]) for w in record.get("data_waits", [])]
    trace_path = directory / TRACE_FILE.format(rank=rank_id)
    if trace_path.exists():
        rank.ops = kineto.read_ops(trace_path)
        rank.has_op_trace = bool(rank.ops)
        if rank.ops and rank.window is not None:
            in_trace = [s.index for s in rank.steps if s.start_ns <= rank.ops[-1].start_ns and s.end_ns >= rank.ops[0].start_ns]
            if in_trace:
                rank.window = (max(rank.window[0], min(in_trace)), min(rank.window[1], max(in_trace)))
    _assign_steps(rank)
    rank.memory = _memory(rank, record.get("memory"))
    return rank


def load_raw(directory: Path) -> ProfileModel:
    """Load a capture written by ``tpu-agent profile`` (the raw directory)."""
    options_path = directory / OPTIONS_FILE
    options: dict[str, Any] = json.loads(options_path.read_text(encoding="utf-8")) if options_path.exists() else {}
    try:
        by_rank = ev.read_events(directory)
    except ValueError as error:
        raise TpuAgentError("unreadable-capture", str(error), "re-run `tpu-agent profile`; the event log is damaged") from None
    rank_ids = set(by_rank) | {int(p.stem.removeprefix("capture-rank")) for p in directory.glob("capture-rank*.json")}
    if not rank_ids:
        raise TpuAgentError(
            "empty-capture",
            f"{directory} holds no event log or capture record",
            "the script may have failed before its first line ran; check its output",
        )
    ranks = {r: _load_rank(directory, r, by_rank.get(r, [])) for r in sorted(rank_ids)}
    run_info = next((e for e in ranks[min(ranks)].events if isinstance(e, ev.RunInfo)), None)
    chip_key = options.get("chip") or (run_info.chip if run_info else DEFAULT_CHIP)
    config = RunConfig(
        chip=get_chip(chip_key),
        eager_mode=(run_info.eager_mode if run_info else None) or options.get("eager_mode"),
        backend=run_info.backend if run_info else None,
        world_size=run_info.world_size if run_info else max(len(ranks), int(options.get("nproc", 1))),
        env=dict(run_info.env) if run_info else {},
        script=options.get("script"),
        requested_steps=options.get("steps"),
        requested_warmup=options.get("warmup"),
        source="tpu-agent",
        session=options.get("session"),
    )
    return ProfileModel(config=config, ranks=ranks)
