"""Process-group setup as many training repos write it: env from torchrun, one GPU per process."""

import os

import torch
import torch.distributed as dist


def setup_distributed(cfg):
    """Initialise the process group; returns (rank, local_rank, world_size)."""
    if "RANK" not in os.environ:
        return 0, 0, 1
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if cfg.device == "cuda":
        if torch.cuda.device_count() < world_size:
            raise RuntimeError(f"need {world_size} GPUs, found {torch.cuda.device_count()}")
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend=cfg.dist_backend,
        device_id=torch.device(cfg.device, local_rank),
        rank=rank,
        world_size=world_size,
    )
    return rank, local_rank, world_size


def all_reduce_mean(value, world_size):
    if world_size > 1:
        dist.all_reduce(value)
        value /= world_size
    return value


def cleanup():
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
