"""The runtime event log: typed records written per rank by the runtime, read by the profiler.

This module is the contract between :mod:`tpu_agent.runtime` (the writer) and :mod:`tpu_agent.profile`
(the reader). Records are appended as JSON lines to ``<dir>/events-rank<R>.jsonl`` when the environment
variable :data:`EVENTS_DIR_ENV` names a directory; otherwise :func:`emit` is a cheap no-op, so the
emulation pays nothing for the log when nobody profiles.

One file per process: a process the rank starts and that runs the runtime (a ``torch.multiprocessing.spawn``
worker, a spawn/forkserver/fork child, a DataLoader worker) logs to ``<dir>/events-rank<R>-pid<PID>.jsonl``
beside its rank's file. Each file then holds one RunInfo and one process's steps, so a reader never untangles
interleaved streams: :func:`read_events` gives the ranks' own logs, :func:`read_logs` every process's, and a
reader that wants the workers' work (a launcher rank that only ``mp.spawn``s) takes them deliberately.

Every record carries the wall-clock time (``time.time_ns``, so ranks and the torch profiler line up), the
rank, the current step (``None`` before the first step marker) and, where a user line caused it, the
:class:`Site` of the first stack frame outside torch, tpu_agent and the standard library.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import sys
import sysconfig
import threading
import time
import types
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

EVENTS_DIR_ENV = "TPU_AGENT_EVENTS_DIR"
EVENTS_FILE_PATTERN = "events-rank{rank}.jsonl"
CHILD_EVENTS_FILE_PATTERN = "events-rank{rank}-pid{pid}.jsonl"  # a process the rank started
_LOG_NAME = re.compile(r"events-rank(\d{1,6})(?:-pid(\d{1,10}))?\.jsonl")
# The torch.profiler record a graph run as one XLA executable leaves in the trace (written by
# runtime.xla.op_records); its children are the graph's ATen ops, whose time profile.kineto spreads by cost.
XLA_EXECUTABLE_RECORD = "xla::executable"


@dataclass(frozen=True)
class Site:
    """A user source location: where a flush, sync, compile or fallback came from."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@dataclass(frozen=True)
class Event:
    """Fields every record has. Subclasses set :attr:`kind` and add their own fields."""

    kind: ClassVar[str] = "event"
    time_ns: int
    rank: int
    step: int | None


@dataclass(frozen=True)
class RunInfo(Event):
    """Written once per process when the runtime activates."""

    kind: ClassVar[str] = "run_info"
    backend: str  # "emulated" or "torch_tpu"
    chip: str  # chip key, e.g. "v6e"
    eager_mode: str  # "DEFER_NEVER", "DEFER_NEVER_AND_LAUNCH_BLOCKING", "DEFER_AND_FUSE"
    world_size: int
    argv: list[str]
    env: dict[str, str]  # the TorchTPU / XLA / tpu-agent variables in force


@dataclass(frozen=True)
class StepMarker(Event):
    """A step boundary: ``phase`` is "begin" or "end"; ``source`` says how the step was found."""

    kind: ClassVar[str] = "step"
    phase: str
    source: str  # "optimizer" | "profiler" | "annotation"


@dataclass(frozen=True)
class OpBatch(Event):
    """Ops dispatched to the device since the previous OpBatch (written at each step end and flush)."""

    kind: ClassVar[str] = "op_batch"
    count: int
    by_name: dict[str, int]


@dataclass(frozen=True)
class Flush(Event):
    """A DeferAndFuse materialisation: pending graph executed because of ``cause``."""

    kind: ClassVar[str] = "flush"
    cause: str  # a FlushCause value (tpu_agent.runtime.emulated.flush_cause lists them, with their meaning)
    graph_ops: int
    graph_hash: str  # stable hash of the op sequence: the same step code gives the same hash
    duration_ns: int
    site: Site | None


@dataclass(frozen=True)
class HostSync(Event):
    """A device-to-host read requested by user code (in any eager mode)."""

    kind: ClassVar[str] = "host_sync"
    op: str  # a host-read FlushCause value (item, tolist, bool...), synchronize, stream/event_synchronize
    site: Site | None


@dataclass(frozen=True)
class Compile(Event):
    """A ``torch.compile(backend="tpu")`` graph compilation; ``reason`` says why it (re)compiled."""

    kind: ClassVar[str] = "compile"
    function: str
    graph_id: int
    graph_ops: int
    is_recompile: bool
    reason: str  # "first call" or the failed guard, e.g. "tensor 'x' size mismatch at index 1"
    duration_ns: int
    site: Site | None


@dataclass(frozen=True)
class CacheHit(Event):
    """A compiled graph served from the XLA executable cache (no compile): with :class:`Compile` records, the
    cache's hit rate, and proof that a steady loop compiles nothing new."""

    kind: ClassVar[str] = "cache_hit"
    function: str
    site: Site | None


@dataclass(frozen=True)
class GraphBreak(Event):
    """A Dynamo graph break under ``torch.compile``."""

    kind: ClassVar[str] = "graph_break"
    reason: str
    site: Site | None


@dataclass(frozen=True)
class FallbackOp(Event):
    """An op the emulation ran through a generic CPU path instead of a native TorchTPU lowering."""

    kind: ClassVar[str] = "fallback_op"
    op: str
    site: Site | None


@dataclass(frozen=True)
class MemorySample(Event):
    """Device memory at a step end: live bytes now and the peak since the previous sample."""

    kind: ClassVar[str] = "memory"
    allocated_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class Collective(Event):
    """One ``tpu_dist`` collective as issued by this rank."""

    kind: ClassVar[str] = "collective"
    op: str
    bytes: int
    group_size: int
    duration_ns: int
    site: Site | None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        RunInfo,
        StepMarker,
        OpBatch,
        Flush,
        HostSync,
        Compile,
        CacheHit,
        GraphBreak,
        FallbackOp,
        MemorySample,
        Collective,
    )
}

# Frames from these roots are library code; the first frame outside them is the user's line.
_LIBRARY_ROOTS = tuple(
    os.path.realpath(p)
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
) + (os.path.dirname(os.path.dirname(os.path.realpath(__file__))),)


@functools.lru_cache(maxsize=4096)
def is_library_file(filename: str) -> bool:
    """Whether ``filename`` is library code (cached per file: the emulator asks once per recorded op)."""
    if filename.startswith("<"):
        return True
    return os.path.realpath(filename).startswith(_LIBRARY_ROOTS)


def user_call_site(skip: int = 1) -> Site | None:
    """The first stack frame outside the standard library, site-packages and tpu_agent, or ``None``.

    ``skip`` counts frames above this one (1: the caller). The single stack walk behind every event's site."""
    frame: types.FrameType | None
    try:
        frame = sys._getframe(skip)
    except ValueError:
        return None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_library_file(filename):
            return Site(file=filename, line=frame.f_lineno, function=frame.f_code.co_name)
        frame = frame.f_back
    return None


def warn_at_user_line(message: str) -> None:
    """A ``UserWarning`` attributed to the user's line (:func:`user_call_site`), not to the emulator frame that
    noticed: ``stacklevel`` counts frames, and the emulator is reached through a varying number of them."""
    site = user_call_site(2)
    warnings.warn_explicit(message, UserWarning, site.file if site else "<tpu>", site.line if site else 0)


def to_json(event: Event) -> str:
    """One JSON line for ``event`` with its ``kind`` tag."""
    return json.dumps({"kind": event.kind, **asdict(event)}, separators=(",", ":"))


def from_dict(record: dict[str, Any]) -> Event:
    """Rebuild the typed record from a parsed JSON line (unknown keys from newer writers are dropped)."""
    cls = EVENT_TYPES[record["kind"]]
    names = {f.name for f in fields(cls)}
    values = {k: v for k, v in record.items() if k in names}
    if isinstance(values.get("site"), dict):
        values["site"] = Site(**values["site"])
    return cls(**values)


@dataclass
class EventLog:
    """Buffered per-process writer; one instance per process, created by :func:`get_log`."""

    path: Path | None
    rank: int
    step: int | None = None
    _buffer: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def emit(self, cls: type[Event], **values: Any) -> None:
        if self.path is None:
            return
        event = cls(time_ns=time.time_ns(), rank=self.rank, step=self.step, **values)
        with self._lock:
            self._buffer.append(to_json(event))
            if len(self._buffer) >= 512:
                self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def reopen(self, path: Path) -> None:
        """Write to ``path`` from now on, dropping what is buffered: for a fork child, whose buffer holds the
        parent's records (the parent writes them itself) and whose lock another thread may have held at the
        fork."""
        self.path = path
        self._buffer = []
        self._lock = threading.Lock()

    def _flush_locked(self) -> None:
        if self.path is None or not self._buffer:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write("\n".join(self._buffer) + "\n")
        self._buffer.clear()


_log: EventLog | None = None
_started_by_rank = False  # this process was started by the rank (spawned, forked): it logs under its pid


def _log_path(directory: str, rank: int) -> Path:
    Path(directory).mkdir(parents=True, exist_ok=True)
    if _started_by_rank:
        return Path(directory) / CHILD_EVENTS_FILE_PATTERN.format(rank=rank, pid=os.getpid())
    return Path(directory) / EVENTS_FILE_PATTERN.format(rank=rank)


def get_log() -> EventLog:
    """The process's event log, opened on first use from :data:`EVENTS_DIR_ENV` and ``RANK``."""
    global _log
    if _log is None:
        rank = int(os.environ.get("RANK", "0"))
        directory = os.environ.get(EVENTS_DIR_ENV)
        _log = EventLog(path=_log_path(directory, rank) if directory else None, rank=rank)
        atexit.register(_log.flush)
    return _log


def log_as_started_process() -> None:
    """Log this process beside its rank's file, under its pid: a spawn/forkserver child calls this before the
    runtime activates (:mod:`tpu_agent.runtime.autoload`), as it inherits the rank's ``RANK``."""
    global _started_by_rank
    _started_by_rank = True


def _after_fork_in_child() -> None:
    """A fork child inherits the rank's open log, buffer and all: it gets a file of its own."""
    log_as_started_process()
    if _log is not None and _log.path is not None:
        _log.reopen(_log_path(str(_log.path.parent), _log.rank))


os.register_at_fork(after_in_child=_after_fork_in_child)


def emit(cls: type[Event], **values: Any) -> None:
    """Append one record to this process's log (no-op unless profiling is on)."""
    get_log().emit(cls, **values)


@dataclass(frozen=True)
class ProcessLog:
    """One process's records: a rank's own (``pid`` None) or those of a process the rank started."""

    rank: int
    pid: int | None
    path: Path
    events: list[Event]


def _read_file(path: Path) -> list[Event]:
    events = []
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            events.append(from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{line_number}: unreadable event record ({error})") from error
    return events


def read_logs(directory: Path) -> list[ProcessLog]:
    """Every process's records under ``directory``, in file order (time order per process): by rank, the
    rank's own log first, then the processes it started in the order they began logging."""
    logs = []
    for path in Path(directory).glob("events-rank*.jsonl"):
        match = _LOG_NAME.fullmatch(path.name)
        if match:
            pid = int(match.group(2)) if match.group(2) else None
            logs.append(ProcessLog(int(match.group(1)), pid, path, _read_file(path)))
    return sorted(logs, key=lambda log: (log.rank, log.pid is not None, log.events[0].time_ns if log.events else 0))


def read_events(directory: Path) -> dict[int, list[Event]]:
    """The ranks' own records, by rank (the processes they started are in :func:`read_logs`)."""
    return {log.rank: log.events for log in read_logs(directory) if log.pid is None}


def iter_kind(events: list[Event], cls: type[Event]) -> Iterator[Event]:
    """The records of one type, e.g. ``iter_kind(events, Flush)``."""
    return (e for e in events if isinstance(e, cls))
