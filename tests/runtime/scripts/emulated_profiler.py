"""What torch.profiler records on the emulated device: the ops the program dispatched, once each, in every mode."""

import json
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from tpu_agent.runtime.emulated import activate

activate()


def step(a: torch.Tensor, b: torch.Tensor) -> float:
    c = a @ b  # f32 at default precision: the emulator rounds both inputs to bf16 beneath this op
    return (c.relu() + 1).sum().item()


def names(fn) -> Counter:
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return Counter(e.name for e in prof.events())


a = torch.randn(8, 16, device="tpu")
b = torch.randn(16, 4, device="tpu")
strict = names(lambda: step(a, b))
torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
fused = names(lambda: step(a, b))
torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
# Recording is back on outside the profiled region, and a plain CPU op is recorded as usual.
cpu = names(lambda: torch.ones(3) + 1)
after = names(lambda: step(a, b))
keys = ("aten::mm", "aten::relu", "aten::_to_copy", "aten::add", "aten::sum", "aten::_local_scalar_dense")
print(json.dumps({label: {k: counts[k] for k in keys} for label, counts in (("strict", strict), ("fused", fused), ("after", after))} | {"cpu_add": cpu["aten::add"]}))
