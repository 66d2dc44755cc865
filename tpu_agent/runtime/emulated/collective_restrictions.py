"""What TorchTPU's ``tpu_dist`` backend refuses, as records: where each restriction applies, the error text the
device raises, the workaround and the reference section. :class:`~.distributed.ProcessGroupTpu` raises them
(:func:`restricted`); tests and documentation read the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from tpu_agent.runtime.emulated.collective_guard import ASYMMETRIC_INPUT

ASYMMETRIC_OUTPUT = "asymmetric output buffer sizes across ranks are not supported on TPU."


@dataclass(frozen=True)
class Restriction:
    """One TorchTPU collective restriction: where it applies, the error it raises, and the source."""

    code: str
    applies_to: str
    message: str
    workaround: str
    reference: str


RESTRICTIONS: dict[str, Restriction] = {
    r.code: r
    for r in (
        Restriction(
            "reduce",
            "dist.reduce",
            "Backend tpu_dist does not support reduce",
            "all_reduce, then use the result on the destination rank",
            "torchtpu_api.md §4.3",
        ),
        Restriction(
            "monitored_barrier",
            "ProcessGroup.monitored_barrier",
            "Backend tpu_dist does not support monitoredBarrier, only GLOO supports monitored barrier.",
            "use a gloo group (dist.new_group(backend='gloo')) for monitored_barrier",
            "torchtpu_api.md §4.3, §8.2",
        ),
        Restriction(
            "premul_sum",
            "ReduceOp.PREMUL_SUM",
            "BuildReduceBody: 'premul_sum' reduction is not supported",
            "scale the tensor, then all_reduce with SUM",
            "torchtpu_api.md §4.3, §8.2",
        ),
        Restriction(
            "asymmetric_input",
            "tensor sizes that differ across ranks",
            ASYMMETRIC_INPUT,
            "pad to equal sizes; give DTensor explicit shape/stride",
            "torchtpu_api.md §4.3, §8.2",
        ),
        Restriction(
            "asymmetric_output",
            "output buffers of unequal size",
            ASYMMETRIC_OUTPUT,
            "pad to equal sizes",
            "torchtpu_api.md §4.3, §8.2",
        ),
        Restriction(
            "barrier_timeout",
            "dist.barrier(timeout=...)",
            "timeout in barrier options is not supported",
            "drop the timeout argument",
            "torchtpu_api.md §8.2",
        ),
        Restriction(
            "barrier_device_ids",
            "dist.barrier(device_ids=[i]), i != 0",
            "device_ids in barrier options is not supported except device_ids=[0]",
            "drop device_ids (each rank sees its device as tpu:0)",
            "torchtpu_api.md §8.2",
        ),
        Restriction(
            "recv_anysource",
            "recv without src",
            "recvAnysource is not supported on TPU",
            "pass src= to recv",
            "torchtpu_api.md §4.3",
        ),
    )
}

UNSET_TIMEOUT = dist.BarrierOptions().timeout  # a barrier given no timeout (one given any is refused)


def restricted(code: str) -> RuntimeError:
    """The error the device raises for restriction ``code``."""
    return RuntimeError(RESTRICTIONS[code].message)
