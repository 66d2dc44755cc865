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
# A whole training step compiled, as TorchTPU's advanced_compile notebook does (forward, backward, optimizer step),
# before any other backward of this thread: the first backward's state change is what broke Dynamo's guards.
net = torch.nn.Linear(4, 2).to("tpu")
optimizer = torch.optim.AdamW(net.parameters(), lr=0.1, capturable=True)


@torch.compile(backend="tpu")
def train_step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    loss = torch.nn.functional.mse_loss(net(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


targets = torch.zeros(4, 2, device="tpu")
losses = [train_step(a, targets).item() for _ in range(3)]

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


@torch.inference_mode()
def infer(t: torch.Tensor) -> torch.Tensor:
    return t * 2


@torch.no_grad()
def infer_no_grad(t: torch.Tensor) -> torch.Tensor:
    return t * 2


def requested(fn):
    """[requests, hits] that running ``fn`` adds to torch.tpu._get_cache_stats()."""
    before = torch.tpu._get_cache_stats()
    fn()
    after = torch.tpu._get_cache_stats()
    return [after.num_cache_reqs - before.num_cache_reqs, after.num_cache_hits - before.num_cache_hits]


x4, x8 = torch.ones(4, device="tpu"), torch.ones(8, device="tpu")
# first call, the same again, a new shape: a miss, a warm hit, a miss; in each eager mode and under compile
cache_requests = {"strict": [requested(lambda t=t: t * 3) for t in (x4, x4, x8)]}
with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
    cache_requests["defer_and_fuse"] = [requested(lambda t=t: (t * 3 + 1).cpu()) for t in (x4, x4, x8)]
scaled = torch.compile(lambda t: t * 3 + 1, backend="tpu")
cache_requests["compile"] = [requested(lambda t=t: scaled(t)) for t in (x4, x4, x8)]
cache_stats = torch.tpu._get_cache_stats()
entries = cache_stats.per_entry_stats
cache_requests["entries_read"] = any(e.read_count >= 1 for e in entries)
cache_requests["compiled_entry_timed"] = any(e.compilation_duration > 0 and e.last_read > 0 for e in entries)
cache_requests["misses"] = torch.tpu._get_cache_misses() == cache_stats.num_cache_reqs - cache_stats.num_cache_hits
torch.tpu.allow_excess_precision = True  # a new compile for every executable, as on TorchTPU
cache_requests["excess_precision_changed"] = requested(lambda: x4 * 3)
torch.tpu.allow_excess_precision = False
torch.tpu._clear_cache()
cache_requests["after_clear"] = requested(lambda: x4 * 3)

# what AOTAutograd asks of a gradient whose output it traced as a plain tensor (RWKV's recurrent state) or as tpu
state = torch.ones(2, device="tpu")
coerced = state.__coerce_same_metadata_as_tangent__(None, torch.Tensor)
tangent_coercion = {
    "to_plain": [type(coerced).__name__, coerced.device.type, coerced.tolist()],
    "to_tpu_is_itself": state.__coerce_same_metadata_as_tangent__(None, type(state)) is state,
    "to_other_is_refused": state.__coerce_same_metadata_as_tangent__(None, torch.nn.Parameter) is None,
}

out = {
    "tangent_coercion": tangent_coercion,
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
    "train_losses": losses,
    "cache_requests": cache_requests,
    "inference_mode": error_of(lambda: torch.compile(infer, backend="tpu")(a)),
    "no_grad": torch.compile(infer_no_grad, backend="tpu")(a).cpu().tolist() == (a * 2).cpu().tolist(),
}
print(json.dumps(out))
dist.destroy_process_group()
