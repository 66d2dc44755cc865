"""Pinned memory and the host's device count in every rank of a multi-rank run (writes results-rankN.json)."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group()
rank, local_world = dist.get_rank(), int(os.environ["LOCAL_WORLD_SIZE"])
data = TensorDataset(torch.arange(16.0).view(8, 2))
loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=False), pin_memory=True, pin_memory_device="tpu")
total = torch.zeros(2, device="tpu")
pinned = []
for (batch,) in loader:
    pinned.append(batch.is_pinned())
    total += batch.to("tpu", non_blocking=True).sum(0)
dist.all_reduce(total)
host = torch.ones(3).pin_memory()
enough = torch.accelerator.device_count() >= local_world  # the check real launch scripts make
results = {
    "device_count": torch.accelerator.device_count(),
    "devices_per_rank": torch.accelerator.device_count() // local_world,
    "enough_devices": enough,
    "current_device": torch.accelerator.current_device_index(),
    "pinned_batches": pinned,
    "pinned_host": [host.is_pinned(), host.to("tpu", non_blocking=True).cpu().tolist()],
    "total": total.cpu().tolist(),
}
Path(sys.argv[1], f"results-rank{rank}.json").write_text(json.dumps(results))
dist.destroy_process_group()
