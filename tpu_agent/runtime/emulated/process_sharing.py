"""Sending ``tpu`` tensors to another process (``torch.multiprocessing``), refused with what to do instead.

Hogwild training (pytorch/examples' mnist_hogwild: ``model.share_memory()``, then ``mp.Process(target=train,
args=(model, ...))``) shares CUDA tensors between processes through CUDA IPC. TorchTPU has no such sharing: one
process owns a TPU (a second one fails with "The TPU is already in use by process with pid N", reference §1.1).
Without this refusal the emulated tensor would pickle a temporary host copy whose shared-memory file is closed
before the child starts, and the spawn would fail with ``ValueError: bad value(s) in fds_to_keep``. Saving with
``torch.save`` is unaffected: only multiprocessing's pickler (which torch.multiprocessing uses) reaches this
reducer.
"""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
from typing import NoReturn

import torch

from tpu_agent.runtime.emulated.tensor import TpuTensor

MESSAGE = (
    "a tpu tensor (shape {shape}) cannot be sent to another process: TorchTPU gives a TPU to one process, and a "
    "process started by torch.multiprocessing cannot use it. For Hogwild-style training keep the shared model on "
    "the CPU (share_memory() and train it there, without moving it to the tpu device); for data parallelism run one process per device with "
    "torch.distributed (tpu-agent run --nproc N)"
)


def _refuse(tensor: torch.Tensor) -> NoReturn:
    raise RuntimeError(MESSAGE.format(shape=tuple(tensor.shape)))


def install() -> None:
    """Register the refusal with torch.multiprocessing's pickler (idempotent: a registration replaces the last)."""
    ForkingPickler.register(TpuTensor, _refuse)
