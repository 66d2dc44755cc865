"""Streams and events of the emulated ``tpu`` device: TorchTPU's ``TpuStream``/``TpuEvent`` (reference §1.5).

XLA orders device work itself, so TorchTPU's streams are placeholders that exist so FSDP-style code runs, and
its events are timed **on the host**: ``record`` dispatches the pending work and notes a host timestamp,
``synchronize`` waits for what ``record`` dispatched, ``elapsed_time`` returns milliseconds (so it includes
dispatch and compile time). In the emulation ``record`` is a DeferAndFuse flush trigger (cause
``event_record``): the pending graph runs, then the timestamp is taken, so a pair of events brackets the work
recorded between them.

Why ``torch.Event``/``torch.Stream`` are replaced rather than served by a device guard: torch 2.13's Python
backend hook (``torch._C._acc.DeviceGuard``) forwards only ``type_`` to Python; its C++ side records events as
no-ops and keeps the base ``elapsedTime`` ("Backend doesn't support elapsedTime."). A real
``DeviceGuardImpl`` needs a compiled C++ extension. So :func:`install` swaps the device-agnostic constructors
for stand-ins that build :class:`TpuEvent`/:class:`TpuStream` when the device is ``tpu`` (named, or the
current accelerator) and torch's own objects otherwise. The tpu classes subclass torch's, so C++ APIs that take
a ``torch.Event``/``torch.Stream`` accept them, and ``isinstance(x, torch.Event)`` still holds for events
torch's C++ side creates. ``torch.tpu.Event``/``torch.tpu.Stream`` are the same classes.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from tpu_agent.runtime.emulated import state, telemetry
from tpu_agent.runtime.emulated.flush_cause import FlushCause

# TorchTPU 0.2.0's own text: its streams are placeholders, and these members raise it on a real TPU too.
STREAMS_MESSAGE = (
    "Streams and Events are not fully implemented in TorchTPU. Please file a feature request describing your use case."
)
_TorchEvent: Any = torch.Event  # typed Any: subclassed below, and torch.Event is replaced at activation
_TorchStream: Any = torch.Stream
_PRIVATEUSE1 = int(torch._C._autograd.DeviceType.PrivateUse1)


def synchronize_device(cause: FlushCause) -> None:
    """Wait for pending work: a host sync, and in DeferAndFuse the pending graph runs (flush ``cause``)."""
    from tpu_agent.runtime.emulated import deferred

    telemetry.host_sync(cause)
    deferred.flush(cause)


class TpuStream(_TorchStream):
    """``torch.tpu.Stream``: a placeholder stream (XLA orders work itself); exists so FSDP-style code runs."""

    def __new__(cls, device: Any = None, priority: int = 0, stream_id: int | None = None, **kwargs: Any) -> TpuStream:
        index = state.index_of(device)
        state.check_device_index(index)
        return super().__new__(cls, stream_id=stream_id or 0, device_index=index, device_type=_PRIVATEUSE1)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def wait_event(self, event: Any) -> None:
        event.wait()

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> TpuEvent:
        event = event if event is not None else TpuEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        synchronize_device(FlushCause.STREAM_SYNCHRONIZE)

    def query(self) -> bool:
        raise NotImplementedError(STREAMS_MESSAGE)

    def priority_range(self) -> Any:
        raise NotImplementedError(STREAMS_MESSAGE)

    @property
    def is_sparse(self) -> bool:
        return False

    @property
    def is_dense(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<torch.tpu.TpuStream>"


class TpuEvent(_TorchEvent):
    """``torch.tpu.Event``: host-timed. ``record`` runs the pending work and takes a timestamp; with the
    work already run, ``synchronize`` is a host sync that waits for nothing more and ``query`` is True."""

    def __new__(
        cls,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        external: bool = False,
        device: Any = None,
    ) -> TpuEvent:
        state.check_device_index(state.index_of(device))
        return super().__new__(cls, device=torch.device("tpu", 0), enable_timing=enable_timing, blocking=blocking)

    def __init__(self, enable_timing: bool = False, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._timing = bool(enable_timing)
        self._time_ns: int | None = None

    def record(self, stream: Any = None) -> None:
        from tpu_agent.runtime.emulated import deferred

        deferred.flush(FlushCause.EVENT_RECORD)
        self._time_ns = time.perf_counter_ns()

    def synchronize(self) -> None:
        if self._time_ns is not None:
            telemetry.host_sync("event_synchronize")

    def query(self) -> bool:
        return True

    def wait(self, stream: Any = None) -> None:
        return None

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds from this event's record to ``end_event``'s, with torch's checks and error texts."""
        if not isinstance(end_event, TpuEvent):
            other = end_event.device.type.upper() if isinstance(end_event, _TorchEvent) else type(end_event).__name__
            raise RuntimeError(f"Event device type TPU does not match other's device type {other}.")
        if not (self._timing and end_event._timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._time_ns is None or end_event._time_ns is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time_ns - self._time_ns) / 1e6

    def ipc_handle(self) -> Any:
        raise NotImplementedError(STREAMS_MESSAGE)

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: Any) -> Any:
        raise NotImplementedError(STREAMS_MESSAGE)


def _targets_tpu(device: Any) -> bool:
    """Whether a ``torch.Event``/``torch.Stream`` ``device`` argument means the tpu (None: the current accelerator)."""
    if device is None or isinstance(device, int):
        accelerator = torch.accelerator.current_accelerator()
        return accelerator is not None and accelerator.type == "tpu"
    return torch.device(device).type == "tpu"


class _AnswersForTorchClass(type):
    """Metaclass of the stand-ins: ``isinstance``/``issubclass`` answer for torch's own class, so objects that
    torch's C++ side creates still pass ``isinstance(x, torch.Event)``."""

    _torch_class: type

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._torch_class)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._torch_class)


class Event(_TorchEvent, metaclass=_AnswersForTorchClass):
    """``torch.Event`` with the emulation active: a :class:`TpuEvent` on the tpu, torch's event elsewhere."""

    _torch_class = _TorchEvent

    def __new__(
        cls, device: Any = None, *, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> Any:
        if _targets_tpu(device):
            return TpuEvent(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess, device=device)
        return _TorchEvent(device, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


class Stream(_TorchStream, metaclass=_AnswersForTorchClass):
    """``torch.Stream`` with the emulation active: a :class:`TpuStream` on the tpu, torch's stream elsewhere
    (also when torch rebuilds a stream from its ``stream_id``/``device_index``/``device_type`` fields)."""

    _torch_class = _TorchStream

    def __new__(cls, device: Any = None, *, priority: int = 0, **fields: Any) -> Any:
        if fields:
            if fields.get("device_type") == _PRIVATEUSE1:
                return TpuStream(fields.get("device_index"), priority, fields.get("stream_id"))
            return _TorchStream(**fields)
        if _targets_tpu(device):
            return TpuStream(device, priority)
        return _TorchStream(device, priority=priority)


def _current_stream(device: Any = None, /) -> TpuStream:
    return TpuStream(device)


def install() -> None:
    """Route ``torch.Event``, ``torch.Stream`` and ``torch.accelerator.current_stream`` to the tpu classes
    (called once, from :func:`device.register`)."""
    torch.Event = Event
    torch.Stream = Stream
    _current_stream.__doc__ = torch.accelerator.current_stream.__doc__
    torch.accelerator.current_stream = _current_stream
