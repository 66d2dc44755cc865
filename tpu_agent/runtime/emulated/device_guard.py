"""The ``tpu`` device guard torch's C++ side calls, safe to call while a Python error is pending.

torch's autograd engine runs each backward node under a guard on the node's device stream; for a Python
backend every guard method asks Python for the device type (``type_``), the guard's destructor included. A
Python exception raised beneath a backward node (a device error from the dispatcher, a fake-tensor refusal
while AOTAutograd traces a backward, such as the data-dependent shape of a boolean-mask ``index_put``, a
tensor hook) leaves the C++ side with the interpreter's error indicator still set: torch keeps the exception
there until the engine's handler takes it. Unwinding to that handler destroys the stream guard first, its
``type_`` call fails because an error is pending, inside a ``noexcept`` method, and ``std::terminate`` aborts
the whole process ("terminate called without an active exception", SIGABRT) instead of ``backward()``
raising. No ``try``/``except`` in Python can catch that.

So :meth:`DeviceGuard.type_` first takes any pending error (a ``ctypes.pythonapi`` call raises the pending
error as it returns) and keeps it for the thread; the engine then unwinds normally and its ``run_backward``
fails without an error ("returned NULL without setting an exception"). The backward wrapper
(:mod:`.autograd_queue`) raises the kept error in that one's place, so the caller sees the original exception:
a device error as the device raised it, a fake-tensor refusal as Dynamo expects it (a graph break, as on CPU).
"""

from __future__ import annotations

import ctypes
import threading

import torch

_TYPE = torch._C._autograd.DeviceType.PrivateUse1
_error_occurred = ctypes.pythonapi.PyErr_Occurred  # any PyDLL call raises the pending error as it returns
_error_occurred.restype = ctypes.c_void_p


class _Taken(threading.local):
    error: BaseException | None = None


_taken = _Taken()


class DeviceGuard(torch._C._acc.DeviceGuard):
    """The guard registered for the ``tpu`` device: answers the device type, taking any pending error first."""

    def type_(self) -> torch._C._autograd.DeviceType:
        try:
            _error_occurred()
        except BaseException as pending:  # noqa: BLE001 - whatever was pending, it is re-raised by take_error's caller
            _taken.error = pending
        return _TYPE


def take_error() -> BaseException | None:
    """The error :class:`DeviceGuard` took on this thread since the last call, if any (and forget it)."""
    error, _taken.error = _taken.error, None
    return error
