"""A rank of a multi-rank run that trains alone: its first optimizer step comes with no collective before it.

Under ``tpu-agent run --nproc N`` every rank runs the script. When nothing averages the gradients (no DDP, FSDP or
``all_reduce``), each rank silently trains its own copy of the model on its share of the data. That is what a
forgotten DDP wrapper does, and what Hugging Face ``Trainer`` does on ``tpu``: accelerate knows no distributed
backend for the device, starts a process group anyway and then trains one process per rank. The emulation sees
every ``tpu_dist`` collective (:data:`distributed.collectives_run`), so at the first ``optimizer.step()`` over
``tpu`` parameters it can tell and warns once at the user's line; later steps return at the first line (torch runs
the hooks from a dictionary it iterates, so a hook cannot remove itself).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import distributed

_installed = False
_checked = False


def _world() -> tuple[int, int]:
    """This process's rank and the run's size: the process group's, else the launcher's environment."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _first_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    global _checked
    if _checked:
        return
    if not any(p.device.type == "tpu" for group in optimizer.param_groups for p in group["params"]):
        return  # a CPU optimizer (a host-side EMA, say): wait for the training one
    _checked = True
    rank, world = _world()
    if world < 2 or distributed.collectives_run:
        return
    events.warn_at_user_line(
        f"rank {rank} of {world} took its first optimizer step with no collective before it: nothing averaged its "
        "gradients with the other ranks', so each rank trains its own copy of the model. Wrap the model in "
        "DistributedDataParallel or FSDP over tpu_dist, or all_reduce the gradients yourself. Hugging Face "
        "Trainer (accelerate) does not know tpu_dist yet and trains this way. Ignore this if the ranks are meant "
        "to train independently."
    )


def install() -> None:
    """Watch for the first optimizer step over tpu parameters (once per process)."""
    global _installed
    if not _installed:
        _installed = True
        register_optimizer_step_post_hook(_first_step)
