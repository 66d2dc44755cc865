"""Rank 1 skips an all_reduce; rank 0's collective must time out with the op and the missing rank named."""

import datetime
import time

import torch
import torch.distributed as dist

dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=3))
t = torch.ones(2, device="tpu")
dist.broadcast(t, 0)
if dist.get_rank() == 1:
    time.sleep(60)
dist.all_reduce(t)
