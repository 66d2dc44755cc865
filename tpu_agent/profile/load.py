"""Build the :class:`~tpu_agent.profile.model.ProfileModel` from what a capture left on disk.

Two inputs, one model:

* our raw directory (``<logdir>/tpu-agent/raw``): the runtime event log, the Kineto trace and the
  capture record per rank, plus ``options.json`` from the parent;
* a foreign XSpace (TorchTPU, JAX): :mod:`tpu_agent.profile.xplane` reads steps and ops from it; the data
  only our hooks record (call sites, DataLoader, weights) is then absent and rules needing it say so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tpu_agent.chips import DEFAULT_CHIP, Chip, get_chip
from tpu_agent.errors import TpuAgentError
from tpu_agent.profile import kineto
from tpu_agent.profile.compiled import load_compiled
from tpu_agent.profile.layout import CAPTURE_FILE, COMPILED_FILE, OPTIONS_FILE, TRACE_FILE
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
from tpu_agent.profile.options import DEFAULT_STEPS, DEFAULT_WARMUP
from tpu_agent.profile.untrusted import damaged, reading, valid_dataclass, vet_files
from tpu_agent.runtime import events as ev
from tpu_agent.runtime.envvars import EAGER_MODES

EAGER_MODE_NAMES = frozenset(mode.enum_name for mode in EAGER_MODES.values())
_CAPTURE_NAME = re.compile(r"capture-rank(\d{1,6})\.json")


def _site(data: dict[str, Any] | None) -> ev.Site | None:
    return ev.Site(**data) if data else None


def _read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from a capture file; anything else is a ``damaged-capture`` error naming the file."""
    with reading(path, what):
        data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise damaged(path, f"{what} is not a JSON object")
    return data


def _checked(path: Path, what: str, items: list[Any]) -> list[Any]:
    """``items`` built from ``path``, refused unless every field has its declared type."""
    for item in items:
        if not valid_dataclass(item):
            raise damaged(path, f"{what} holds a {type(item).__name__} with a value of the wrong type: {item!r:.200}")
    return items


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
    record: dict[str, Any] = _read_json_object(record_path, "the capture record") if record_path.exists() else {}
    if record:
        _apply_record(rank, record, record_path)
    trace_path = directory / TRACE_FILE.format(rank=rank_id)
    if trace_path.exists():
        with reading(trace_path, "the torch.profiler trace"):
            rank.ops = kineto.read_ops(trace_path)
        bad = next((op for op in rank.ops if not kineto.well_typed(op)), None)
        if bad is not None:
            raise damaged(
                trace_path, f"the torch.profiler trace holds an op with a value of the wrong type: {bad!r:.200}"
            )
        rank.has_op_trace = bool(rank.ops)
        if rank.ops and rank.window is not None:
            in_trace = [
                s.index for s in rank.steps if s.start_ns <= rank.ops[-1].start_ns and s.end_ns >= rank.ops[0].start_ns
            ]
            if in_trace:
                rank.window = (max(rank.window[0], min(in_trace)), min(rank.window[1], max(in_trace)))
    _assign_steps(rank)
    with reading(record_path, "the memory measurement in the capture record"):
        rank.memory = _memory(rank, record.get("memory"))
    return rank


def _apply_record(rank: RankProfile, record: dict[str, Any], path: Path) -> None:
    """What the capture hooks recorded for one rank (``capture-rank<R>.json``), type-checked field by field."""
    with reading(path, "the capture record"):
        rank.host = str(record.get("host", rank.host))
        first, last = record["window"]
        rank.window = (int(first), int(last))
        rank.step_site = _site(record.get("step_site"))
        rank.forward_site = _site(record.get("forward_site"))
        rank.module_types = [str(t) for t in record.get("module_types", [])]
        mode = record.get("window_eager_mode")
        rank.window_eager_mode = mode if mode in EAGER_MODE_NAMES else None
        rank.weights = [
            Weight(w["module"], w["module_type"], tuple(w["shape"]), w["dtype"], _site(w.get("site")))
            for w in record.get("weights", [])
        ]
        rank.dataloaders = [
            DataLoaderInfo(d["batch_size"], d["num_workers"], d["drop_last"], d["dataset_len"], _site(d.get("site")))
            for d in record.get("dataloaders", [])
        ]
        rank.warnings.extend(str(w) for w in record.get("warnings", []))
        rank.losses = [float(x) for x in record.get("losses", [])]
        rank.data_waits = [
            DataWait(w["step"], w["duration_ns"], _site(w.get("site")), w["time_ns"])
            for w in record.get("data_waits", [])
        ]
        memory = record.get("memory")
        if memory is not None and not (
            isinstance(memory, dict)
            and all(isinstance(memory.get(k), int) for k in ("param_bytes", "grad_bytes", "optimizer_bytes"))
        ):
            raise ValueError("memory needs integer param_bytes, grad_bytes and optimizer_bytes")
    sites = [s for s in (rank.step_site, rank.forward_site) if s is not None]
    for what, items in (
        ("a weight", rank.weights),
        ("a DataLoader", rank.dataloaders),
        ("a data wait", rank.data_waits),
        ("a site", sites),
    ):
        _checked(path, f"{what} entry", items)


def load_raw(directory: Path, chip: Chip | None = None) -> ProfileModel:
    """Load a capture written by ``tpu-agent profile`` (the raw directory).

    The ranks are the ranks' own logs; the processes they started (``events-rank<R>-pid<PID>.jsonl``) are
    left out, named in a warning when they ran steps, unless the ranks ran none: a script that only
    ``mp.spawn``s its workers is profiled as those workers. ``chip`` replaces the chip the capture was made for
    (parsed once by the caller: ``profile``'s options, ``diagnose --chip``)."""
    vet_files(directory)  # every record read below is then a plain file of bounded size
    options_path = directory / OPTIONS_FILE
    options: dict[str, Any] = _read_json_object(options_path, "the profile options") if options_path.exists() else {}
    with reading(directory, "the runtime event log (events-rank*.jsonl)"):
        logs = ev.read_logs(directory)
    for log in logs:
        _checked(log.path, "the runtime event log", log.events)
    by_rank = {log.rank: log.events for log in logs if log.pid is None}
    captured = (_CAPTURE_NAME.fullmatch(p.name) for p in directory.glob("capture-rank*.json"))
    rank_ids = set(by_rank) | {int(m.group(1)) for m in captured if m}
    if not rank_ids:
        raise TpuAgentError(
            "empty-capture",
            f"{directory} holds no event log or capture record",
            "the script may have failed before its first line ran; check its output",
        )
    ranks = {r: _load_rank(directory, r, by_rank.get(r, [])) for r in sorted(rank_ids)}
    run_info = next((e for e in ranks[min(ranks)].events if isinstance(e, ev.RunInfo)), None)
    workers = [log for log in logs if log.pid is not None and steps_from_markers(log.events)]
    if workers and not any(rank.steps for rank in ranks.values()):
        with reading(options_path, "the profile options"):
            warmup = int(options.get("warmup", DEFAULT_WARMUP))
            window = (warmup, warmup + int(options.get("steps", DEFAULT_STEPS)) - 1)
        ranks = _worker_ranks(workers, window)
    elif workers:
        for log in workers:
            ranks[log.rank if log.rank in ranks else min(ranks)].warnings.append(
                f"process {log.pid}, started by rank {log.rank}, ran steps of its own; they are in {log.path.name}, "
                "not in this profile"
            )
    with reading(options_path, "the profile options"):
        model = _model(options, ranks, run_info, chip)
    model.compiled = load_compiled(directory / COMPILED_FILE)
    return model


def _worker_ranks(workers: list[ev.ProcessLog], window: tuple[int, int]) -> dict[int, RankProfile]:
    """The profile of a run whose ranks only started workers (``mp.spawn``) that did the steps: one rank per
    worker, numbered in the order they started, measured over the requested ``window`` (the capture hooks,
    which report it and the model's weights, ran in the rank only)."""
    ranks = {}
    for index, log in enumerate(workers):
        rank = RankProfile(rank=index, events=log.events, steps=steps_from_markers(log.events), window=window)
        rank.warnings.append(
            f"profiled rank {index} is process {log.pid}, which rank {log.rank} started and which ran the steps "
            f"({log.path.name}); rank {log.rank} itself ran none"
        )
        with reading(log.path, "the runtime event log"):
            rank.memory = _memory(rank, None)
        ranks[index] = rank
    return ranks


def _script_args(run_info: ev.RunInfo | None, options: dict[str, Any]) -> list[str]:
    """The script's own arguments: as the script saw them (RunInfo's argv), else as ``profile`` was given them."""
    args: object = options.get("args")
    if run_info is not None:
        args = run_info.argv[1:] if isinstance(run_info.argv, list) else None
    return [str(arg) for arg in args] if isinstance(args, list) else []


def _model(
    options: dict[str, Any], ranks: dict[int, RankProfile], run_info: ev.RunInfo | None, chip: Chip | None
) -> ProfileModel:
    """The run's configuration from the lowest rank's own RunInfo (a worker's shows its interpreter's argv)."""
    if chip is None:
        chip = get_chip(str(options.get("chip") or (run_info.chip if run_info else DEFAULT_CHIP)))
    config = RunConfig(
        chip=chip,
        # the mode the window ran in (a script may switch it), else the one the run started in
        eager_mode=ranks[min(ranks)].window_eager_mode
        or (run_info.eager_mode if run_info else None)
        or options.get("eager_mode"),
        backend=run_info.backend if run_info else None,
        world_size=max(run_info.world_size, len(ranks)) if run_info else max(len(ranks), int(options.get("nproc", 1))),
        env=dict(run_info.env) if run_info else {},
        script=str(options["script"]) if options.get("script") is not None else None,
        script_args=_script_args(run_info, options),
        requested_steps=int(options["steps"]) if options.get("steps") is not None else None,
        requested_warmup=int(options["warmup"]) if options.get("warmup") is not None else None,
        source="tpu-agent",
        session=options.get("session"),  # untrusted: api checks it is a plain name before writing there
    )
    return ProfileModel(config=config, ranks=ranks)


__all__ = ["load_raw", "steps_from_markers"]
