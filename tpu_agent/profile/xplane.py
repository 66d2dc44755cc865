"""XSpace writer and reader in the layout XProf (TensorBoard's Profile tab, the ``xprof`` CLI) opens.

Writer (layout verified by opening the result in xprof 2.24; see openxla/xprof on GitHub): one
``/host:CPU`` plane per rank with

* one line per host thread holding the aten ops (stat ``tf_op="<op>:<type>"``, so *framework op stats*
  lists them) and the steps (``ProfilerStep#N`` with stats ``step_num`` and ``_r=1``, so the *overview*
  measures step time);
* a ``tpu-agent runtime`` line: flushes, host syncs, compiles, graph breaks, collectives, DataLoader waits;
* a ``tpu-agent diagnostics`` line: every finding at its time, with rule id, severity and source line.

Files go to ``<logdir>/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>[_<rank>].xplane.pb``.

Reader: :func:`read_xspace` turns any XSpace (ours, TorchTPU's, JAX's) into a
:class:`~tpu_agent.profile.model.RankProfile`; :func:`annotate` writes a copy of a foreign session with
our diagnostics line added, leaving the original untouched.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_agent.fsutil import read_regular
from tpu_agent.profile.model import Finding, Op, RankProfile, Step
from tpu_agent.profile.untrusted import MAX_CAPTURE_FILE_BYTES, write_confined
from tpu_agent.profile.xplane_schema import XSpace
from tpu_agent.runtime import events as ev

HOST_PLANE = "/host:CPU"
RUNTIME_LINE = "tpu-agent runtime"
DIAGNOSTICS_LINE = "tpu-agent diagnostics"
SESSION_FORMAT = "%Y_%m_%d_%H_%M_%S"


def session_name(when: float | None = None) -> str:
    """XProf session directory name: local time, as JAX and TorchTPU name theirs."""
    return time.strftime(SESSION_FORMAT, time.localtime(when))


def xplane_filename(host: str, rank: int, world_size: int) -> str:
    return f"{host}.xplane.pb" if world_size <= 1 else f"{host}_{rank}.xplane.pb"


@dataclass
class TimelineEvent:
    """One event to write: name, wall-clock start and duration in ns, and its stats."""

    name: str
    start_ns: int
    duration_ns: int
    stats: dict[str, str | int | float] = field(default_factory=dict)


class _PlaneBuilder:
    """Interns event and stat names per plane, as the XSpace format requires."""

    def __init__(self, plane: Any) -> None:
        self.plane = plane
        self.event_ids = {m.name: i for i, m in plane.event_metadata.items()}
        self.stat_ids = {m.name: i for i, m in plane.stat_metadata.items()}

    def _event_id(self, name: str) -> int:
        if name not in self.event_ids:
            new_id = max(self.event_ids.values(), default=0) + 1
            self.plane.event_metadata[new_id].id = new_id
            self.plane.event_metadata[new_id].name = name
            self.event_ids[name] = new_id
        return self.event_ids[name]

    def _stat_id(self, name: str) -> int:
        if name not in self.stat_ids:
            new_id = max(self.stat_ids.values(), default=0) + 1
            self.plane.stat_metadata[new_id].id = new_id
            self.plane.stat_metadata[new_id].name = name
            self.stat_ids[name] = new_id
        return self.stat_ids[name]

    def add_line(
        self,
        line_id: int,
        name: str,
        events: Iterable[TimelineEvent],
        origin_ns: int | None = None,
        intern: bool = False,
    ) -> Any:
        """One XLine; ``intern`` stores string stats as references to stat metadata, as XProf's own writer does
        for the op lines (thousands of events repeating a few op names, shapes and dtypes: a third less to
        build and write). Lines people read through other tools (runtime, diagnostics) keep plain strings."""
        ordered = sorted(events, key=lambda e: (e.start_ns, -e.duration_ns))
        line = self.plane.lines.add(id=line_id, display_id=line_id, name=name, display_name=name)
        if not ordered:
            return line
        base = origin_ns if origin_ns is not None else ordered[0].start_ns
        line.timestamp_ns = base
        end = base
        add_event, event_id, stat_id = line.events.add, self._event_id, self._stat_id
        for item in ordered:
            event = add_event(
                metadata_id=event_id(item.name),
                offset_ps=(item.start_ns - base) * 1000,
                duration_ps=max(item.duration_ns, 0) * 1000,
            )
            if item.start_ns + item.duration_ns > end:
                end = item.start_ns + item.duration_ns
            add_stat = event.stats.add
            for key, value in item.stats.items():
                if isinstance(value, (bool, int)):
                    add_stat(metadata_id=stat_id(key), int64_value=int(value))
                elif isinstance(value, float):
                    add_stat(metadata_id=stat_id(key), double_value=value)
                elif intern:
                    add_stat(metadata_id=stat_id(key), ref_value=stat_id(str(value)))
                else:
                    add_stat(metadata_id=stat_id(key), str_value=str(value))
        line.duration_ps = (end - base) * 1000
        return line


def _op_events(ops: Iterable[Op]) -> dict[int, list[TimelineEvent]]:
    """Ops by thread; kernels (``Op.costed``) also carry their shapes, dtypes and FLOPs as trace-viewer args."""
    by_thread: dict[int, list[TimelineEvent]] = {}
    tf_ops: dict[str, str] = {}
    for op in ops:
        tf_op = tf_ops.get(op.name)
        if tf_op is None:
            tf_op = tf_ops[op.name] = f"{op.name}:{op.name.rpartition('::')[2]}"
        stats: dict[str, str | int | float] = {"tf_op": tf_op}
        if op.costed and op.input_shapes:
            stats["shapes"] = str(op.input_shapes)
            stats["dtypes"] = ",".join(t for t in op.input_dtypes if t)
            if op.flops:
                stats["flops"] = int(op.flops)
        by_thread.setdefault(op.thread, []).append(TimelineEvent(op.name, op.start_ns, op.duration_ns, stats))
    return by_thread


def _step_events(steps: Iterable[Step]) -> list[TimelineEvent]:
    return [
        TimelineEvent(f"ProfilerStep#{s.index}", s.start_ns, s.duration_ns, {"step_num": s.index, "_r": 1})
        for s in steps
    ]


def _site_text(site: ev.Site | None) -> str:
    return f"{site.file}:{site.line}" if site else ""


def runtime_events(rank: RankProfile) -> list[TimelineEvent]:
    """The runtime event log and DataLoader waits as timeline events (instants get 1 µs so they show)."""
    items: list[TimelineEvent] = []
    for event in rank.events:
        site = getattr(event, "site", None)
        stats: dict[str, str | int | float] = {"source": _site_text(site)} if site else {}
        if isinstance(event, ev.Flush):
            items.append(
                TimelineEvent(
                    f"flush ({event.cause})",
                    event.time_ns - event.duration_ns,
                    max(event.duration_ns, 1000),
                    {**stats, "graph_ops": event.graph_ops, "graph_hash": event.graph_hash},
                )
            )
        elif isinstance(event, ev.HostSync):
            items.append(TimelineEvent(f"host sync ({event.op})", event.time_ns, 1000, stats))
        elif isinstance(event, ev.Compile):
            name = "recompile" if event.is_recompile else "compile"
            items.append(
                TimelineEvent(
                    f"{name} {event.function}",
                    event.time_ns - event.duration_ns,
                    max(event.duration_ns, 1000),
                    {**stats, "reason": event.reason},
                )
            )
        elif isinstance(event, ev.GraphBreak):
            items.append(TimelineEvent("graph break", event.time_ns, 1000, {**stats, "reason": event.reason}))
        elif isinstance(event, ev.Collective):
            items.append(
                TimelineEvent(
                    event.op,
                    event.time_ns - event.duration_ns,
                    max(event.duration_ns, 1000),
                    {**stats, "bytes": event.bytes},
                )
            )
        elif isinstance(event, ev.FallbackOp):
            items.append(TimelineEvent(f"cpu fallback {event.op}", event.time_ns, 1000, stats))
    for wait in rank.data_waits:
        items.append(
            TimelineEvent("DataLoader wait", wait.time_ns, wait.duration_ns, {"source": _site_text(wait.site)})
        )
    return items


def finding_events(findings: Iterable[Finding], default_ns: int) -> list[TimelineEvent]:
    items = []
    for finding in findings:
        stats: dict[str, str | int | float] = {
            "rule_id": finding.rule_id,
            "severity": finding.severity.value,
            "title": finding.title,
            "estimated_saving_pct": round(finding.estimated_saving_pct, 2),
            "suggestion": finding.suggestion,
        }
        if finding.locations:
            stats["source"] = str(finding.locations[0])
        start = finding.time_ns if finding.time_ns is not None else default_ns
        items.append(TimelineEvent(f"{finding.rule_id}: {finding.title}", start, 1000, stats))
    return items


def build_xspace(rank: RankProfile, findings: Iterable[Finding]) -> Any:
    """The XSpace for one rank of our capture."""
    space = XSpace(hostnames=[rank.host])
    plane = space.planes.add(id=0, name=HOST_PLANE)
    builder = _PlaneBuilder(plane)
    window = rank.steps_in_window()
    threads = _op_events(rank.ops)
    main_thread = max(threads, key=lambda t: len(threads[t])) if threads else 1
    threads.setdefault(main_thread, []).extend(_step_events(window))
    for line_id, (thread, items) in enumerate(sorted(threads.items()), start=1):
        builder.add_line(line_id, f"python thread {thread}", items, intern=True)
    origin = window[0].start_ns if window else (rank.ops[0].start_ns if rank.ops else time.time_ns())
    builder.add_line(len(threads) + 1, RUNTIME_LINE, runtime_events(rank))
    builder.add_line(len(threads) + 2, DIAGNOSTICS_LINE, finding_events(findings, origin))
    return space


def write_session(
    session_dir: Path, ranks: Iterable[RankProfile], findings: list[Finding], world_size: int, root: Path
) -> list[Path]:
    """Write one ``.xplane.pb`` per rank into ``session_dir``; each rank's file carries its findings. Nothing is
    written outside ``root`` (the log directory), whatever links the session directory holds."""
    paths = []
    for rank in ranks:
        own = [f for f in findings if f.rank in (None, rank.rank)]
        path = session_dir / xplane_filename(rank.host, rank.rank, world_size)
        write_confined(root, path, build_xspace(rank, own).SerializeToString())
        paths.append(path)
    return paths


# -- reading ----------------------------------------------------------------------------------------


def parse(path: Path) -> Any:
    space = XSpace()
    space.ParseFromString(read_regular(path, limit=MAX_CAPTURE_FILE_BYTES, follow_symlinks=True))
    return space


def _stat_value(stat: Any, plane: Any) -> str | int | float:
    kind = stat.WhichOneof("value")
    if kind == "ref_value":
        meta = plane.stat_metadata.get(stat.ref_value)
        return meta.name if meta is not None else ""
    if kind is None:
        return ""
    value = getattr(stat, kind)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def read_xspace(path: Path, rank_id: int = 0) -> RankProfile:
    """Steps and host/device ops from any XSpace.

    Steps: events with a ``step_num`` stat (TSL ``StepTraceAnnotation``, our ``ProfilerStep#N``) on the host
    plane, or the device ``Steps`` line. Ops: events carrying ``tf_op`` (framework ops) or ``hlo_op``
    (XLA ops; on a ``/device:TPU`` plane they make a device trace).
    """
    space = parse(path)
    host = space.hostnames[0] if space.hostnames else path.name.split(".")[0]
    rank = RankProfile(rank=rank_id, host=host)
    steps: dict[int, Step] = {}
    for plane in space.planes:
        is_device = plane.name.startswith("/device:")
        rank.has_device_trace = rank.has_device_trace or (is_device and "TPU" in plane.name)
        for line in plane.lines:
            for event in line.events:
                meta = plane.event_metadata.get(event.metadata_id)
                name = meta.name if meta is not None else ""
                stats = {
                    plane.stat_metadata[s.metadata_id].name: _stat_value(s, plane)
                    for s in event.stats
                    if s.metadata_id in plane.stat_metadata
                }
                start = line.timestamp_ns + event.offset_ps // 1000
                duration = event.duration_ps // 1000
                if "step_num" in stats and (is_device or stats.get("_r") == 1 or name.startswith("ProfilerStep#")):
                    number = int(stats["step_num"])
                    steps.setdefault(number, Step(number, start, start + duration, "xspace"))
                elif "tf_op" in stats or "hlo_op" in stats:
                    op_name = str(stats["tf_op"]).rsplit(":", 1)[0] if "tf_op" in stats else name
                    rank.ops.append(Op(name=op_name, start_ns=start, duration_ns=duration, thread=int(line.id)))
    rank.steps = sorted(steps.values(), key=lambda s: s.index)
    rank.ops.sort(key=lambda o: o.start_ns)
    rank.has_op_trace = bool(rank.ops)
    for op in rank.ops:
        op.step = rank.step_of(op.start_ns)
    rank.warnings.extend(list(space.warnings) + list(space.errors))
    return rank


def annotate(source: Path, target: Path, findings: list[Finding], root: Path) -> None:
    """Copy ``source`` to ``target`` with a diagnostics line added to its host plane (original untouched);
    ``target`` must stay inside ``root``."""
    space = parse(source)
    plane = next((p for p in space.planes if p.name == HOST_PLANE), None)
    if plane is None:
        plane = space.planes.add(id=len(space.planes), name=HOST_PLANE)
    builder = _PlaneBuilder(plane)
    origin = min((line.timestamp_ns for line in plane.lines if line.events), default=0)
    line_id = max((line.id for line in plane.lines), default=0) + 1
    builder.add_line(line_id, DIAGNOSTICS_LINE, finding_events(findings, origin), origin_ns=None)
    write_confined(root, target, space.SerializeToString())


__all__ = ["annotate", "build_xspace", "read_xspace", "session_name", "write_session"]
