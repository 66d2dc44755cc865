"""How a collective's tensors reach gloo: the CPU data behind ``tpu`` tensors, staged contiguous, and the
finished work handed back to torch.

gloo computes in place on CPU tensors. A ``tpu`` tensor's data is a CPU tensor, so handing gloo that data makes
its results the ``tpu`` tensor's (:class:`Staged`); pending DeferAndFuse work runs first (:func:`flush_if_tpu`).
The emulated collectives wait for gloo before returning, so the ``Work`` torch gets back is already done
(:class:`DoneWork`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.futures import Future

from tpu_agent.runtime.emulated.flush_cause import FlushCause

DEVICE_TYPE = "tpu"


class DoneWork(dist.Work):
    """A finished collective (the gloo call underneath was waited for); ``get_future`` yields ``result``."""

    def __init__(self, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._result = result
        self._future: Future[list[torch.Tensor]] = Future()
        self._future.set_result(result)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> Future[list[torch.Tensor]]:
        return self._future


class Staged:
    """The CPU tensors a gloo call works on, for a list of (possibly ``tpu``) tensors.

    ``tpu`` tensors are replaced by the CPU tensor holding their data, so gloo's in-place results are the
    ``tpu`` tensors' results; a non-contiguous one goes through a contiguous copy written back afterwards.
    """

    def __init__(self) -> None:
        self._write_back: list[tuple[torch.Tensor, torch.Tensor]] = []

    def cpu(self, tensor: torch.Tensor) -> torch.Tensor:
        data = cpu_data(tensor)
        if data.is_contiguous():
            return data
        dense = data.contiguous()
        self._write_back.append((data, dense))
        return dense

    def cpus(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [self.cpu(t) for t in tensors]

    def finish(self) -> None:
        for data, dense in self._write_back:
            data.copy_(dense)


def cpu_data(tensor: torch.Tensor) -> torch.Tensor:
    """The CPU tensor gloo works on for ``tensor``: a ``tpu`` tensor's data (made now if pending), else itself."""
    if tensor.device.type == DEVICE_TYPE:
        from tpu_agent.runtime.emulated.tensor import unwrap

        return unwrap(tensor)
    return tensor


def flush_if_tpu(tensors: Sequence[torch.Tensor]) -> None:
    """Run the pending DeferAndFuse graph before a collective on ``tpu`` tensors (its inputs must be final)."""
    if any(t.device.type == DEVICE_TYPE for t in tensors):
        from tpu_agent.runtime.emulated.tensor import flush_pending

        flush_pending(FlushCause.COLLECTIVE)


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    """The bytes a collective moves for ``tensors`` (its Collective event's size)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def same_shapes(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> bool:
    """Whether every tensor has ``like``'s shape (TorchTPU refuses output buffers of unequal size)."""
    return all(t.shape == like.shape for t in tensors)
