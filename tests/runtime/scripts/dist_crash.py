"""Rank 1 exits with code 3 after the first collective; rank 0 would wait forever in the next one."""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("tpu")  # TorchTPU registers "tpu" as an alias of "tpu_dist"
t = torch.ones(2, device="tpu")
dist.all_reduce(t)
if dist.get_rank() == 1:
    print("rank 1 exiting", flush=True)
    sys.exit(3)
dist.all_reduce(t)
time.sleep(60)
