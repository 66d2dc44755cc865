"""Where new tpu tensors keep their data, and who answers a host read: the seam capture-only mode plugs into.

Normally a tpu tensor's data is a CPU tensor and a host read (``item()``, ``print(t)``, ``bool(t)``) reads it.
``tpu-agent estimate --capture-only`` (:mod:`tpu_agent.estimate.capture_only`) records a script's graphs
without computing values: it gives new tensors *meta* data, keeps the small ones (a batch, masks made from it)
on the CPU, and answers host reads itself. It changes these settings only through the functions below; the
factories (:mod:`.device`), the dispatcher (:mod:`.dispatch`) and the host reads (:mod:`.tensor`) read the
module attributes, which are plain globals because the dispatcher reads them per op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import torch

from tpu_agent.runtime.emulated.flush_cause import FlushCause

CPU = torch.device("cpu")


class HostRead(Protocol):
    """Answers a host read of ``t`` (``cause`` names it: item, tolist, bool...) with a host tensor."""

    def __call__(self, t: torch.Tensor, cause: FlushCause) -> torch.Tensor: ...


DATA_DEVICE: torch.device = CPU  # where new tpu tensors keep their data
SMALL_DATA_BYTES = 0  # new tensors up to this many bytes keep CPU data whatever DATA_DEVICE is (0: none)
host_read: HostRead | None = None  # who answers host reads instead of the data (None: the data)


def place_data_on(device: torch.device, small_bytes: int = 0) -> None:
    """New tpu tensors keep their data on ``device`` from now on; those up to ``small_bytes`` stay on the CPU,
    so values a library branches on (``if mask.all():``) can still be read."""
    global DATA_DEVICE, SMALL_DATA_BYTES
    DATA_DEVICE = device
    SMALL_DATA_BYTES = small_bytes


@contextlib.contextmanager
def placed_on(device: torch.device) -> Iterator[None]:
    """New tpu tensors keep their data on ``device`` inside the block (one op computed for real under
    capture-only: what its device argument makes is real data too)."""
    global DATA_DEVICE
    previous = DATA_DEVICE
    DATA_DEVICE = device
    try:
        yield
    finally:
        DATA_DEVICE = previous


def set_host_read(answer: HostRead | None) -> None:
    """Host reads are answered by ``answer`` from now on (``None``: by the tensor's data, after a flush)."""
    global host_read
    host_read = answer


def data_device_for(numel: int, dtype: torch.dtype | None) -> torch.device:
    """Where a new tpu tensor of ``numel`` elements keeps its data (see :data:`SMALL_DATA_BYTES`)."""
    if SMALL_DATA_BYTES and numel * (dtype or torch.get_default_dtype()).itemsize <= SMALL_DATA_BYTES:
        return CPU
    return DATA_DEVICE
