"""Dynamo is imported only by a run that compiles, and collectives then still run (as graph breaks)."""

import json
import sys

import torch
import torch.distributed as dist

from tpu_agent.runtime.emulated import activate, distributed

activate()
distributed.register()
dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
x = torch.ones(4, device="tpu")
dist.all_reduce(x)
dynamo_before_compile = "torch._dynamo" in sys.modules


@torch.compile(backend="tpu")
def reduce_twice(t: torch.Tensor) -> torch.Tensor:
    t = t * 2
    dist.all_reduce(t)
    return t + 1


out = reduce_twice(x)
print(json.dumps({"dynamo_before_compile": dynamo_before_compile, "compiled": out.cpu().tolist()}))
dist.destroy_process_group()
