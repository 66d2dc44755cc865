"""torch.compile on the emulated tpu: backend selection, TorchTPU refusals, compile/recompile events; and Dynamo,
imported only once the run compiles, with collectives still running inside a compiled function (as graph breaks)."""

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


def error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return {"type": type(e).__name__, "message": str(e)}
    return None


def f(a, b):
    return (a @ b).relu().sum(0)


a, b = torch.randn(4, 4, device="tpu"), torch.randn(4, 4, device="tpu")
compiled = torch.compile(f, backend="tpu")
first = compiled(a, b)
second = compiled(torch.randn(8, 4, device="tpu"), b)
default_backend = torch.compile(lambda t: t * 2)(a)
model = torch.nn.Linear(4, 4).to("tpu")
torch.compile(model)(a).sum().backward()


@torch.compile(backend="tpu")
def reduce_twice(t: torch.Tensor) -> torch.Tensor:
    t = t * 2
    dist.all_reduce(t)
    return t + 1


out = {
    "compiled_device": str(first.device),
    "matches_eager": torch.allclose(first.cpu(), f(a, b).cpu()),
    "recompiled_shape": list(second.shape),
    "default_backend_device": str(default_backend.device),
    "grad": str(model.weight.grad.device),
    "dynamic": error_of(lambda: torch.compile(f, backend="tpu", dynamic=True)),
    "mode": error_of(lambda: torch.compile(f, backend="tpu", mode="max-autotune")),
    "options": error_of(lambda: torch.compile(f, backend="tpu", options={"triton.cudagraphs": True})),
    "inductor": error_of(lambda: torch.compile(f, backend="inductor")(a, b)),
    "dynamo_before_compile": dynamo_before_compile,
    "compiled_collective": reduce_twice(x).cpu().tolist(),
}
print(json.dumps(out))
dist.destroy_process_group()
