"""Rank 1 returns cleanly after the first collective; rank 0 waits in the second one and must be told who left."""

import torch
import torch.distributed as dist

dist.init_process_group("tpu_dist")
t = torch.ones(2, device="tpu")
dist.all_reduce(t)
if dist.get_rank() == 0:
    dist.all_reduce(t)
