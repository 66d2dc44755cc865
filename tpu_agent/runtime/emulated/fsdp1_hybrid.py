"""FSDP1's ``HYBRID_SHARD`` / ``_HYBRID_SHARD_ZERO2`` without a ``device_mesh``: refused with the way out.

Given no ``device_mesh`` and no ``process_group`` pair, FSDP1 makes its own groups: it shards within each host
over ``torch.accelerator.device_count()`` consecutive ranks and replicates across hosts, which assumes one
process per device on every host. In a multi-process run each TorchTPU process sees its one chip, so the groups
are single ranks and nothing is refused; a process that sees several devices (a lone process on a v6e-4 host, or
``TPU_VISIBLE_DEVICES`` naming several) with fewer ranks than that breaks the assumption, and torch says only "The
arg 'group_size' (4) must not exceed the world size (1)". The emulation refuses it with a ``ValueError``, as
torch's, saying why and what to pass instead. With a ``device_mesh`` (or a
pair of groups) the hybrid strategies train as on a device, and this check is not reached.

Patched with :mod:`fsdp1_offload`'s import hook, when the program imports ``torch.distributed.fsdp``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist


def _checked(original: Callable[[Any, int], Any]) -> Callable[[Any, int], Any]:
    """``_init_intra_and_inter_node_groups`` that refuses a world size its per-host groups cannot divide."""

    def init_groups(global_process_group: Any, num_devices_per_node: int) -> Any:
        world = dist.get_world_size(global_process_group)
        if world % num_devices_per_node:
            raise ValueError(
                f"FSDP HYBRID_SHARD without a device_mesh shards within each host over its "
                f"torch.accelerator.device_count() = {num_devices_per_node} TPU devices, one rank each, so it "
                f"needs a world size that is a multiple of {num_devices_per_node}, and this run has {world}: pass "
                f'device_mesh=init_device_mesh("tpu", (replicas, shards), mesh_dim_names=("replicate", "shard")) '
                f"with replicas * shards == {world} (or process_group=(shard_group, replicate_group)), or start "
                f"{num_devices_per_node} ranks per host (--nproc {num_devices_per_node})"
            )
        return original(global_process_group, num_devices_per_node)

    return init_groups


def patch() -> None:
    """Install the check (called once ``torch.distributed.fsdp`` is imported)."""
    from torch.distributed.fsdp import _init_utils

    _init_utils._init_intra_and_inter_node_groups = _checked(_init_utils._init_intra_and_inter_node_groups)


__all__ = ["patch"]
