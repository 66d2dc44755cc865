"""Behaviours TorchTPU's guide pages document, one check each (docs/torchtpu-fidelity.md names the test reading it).

Run by tests/runtime/test_torchtpu_guide.py under `tpu-agent run`; prints one JSON object. Written for this
project from the guide's statements, not from its code.
"""
import importlib.util
import json
import sys
import warnings

warnings.simplefilter("ignore")

import torch
import torch.nn.functional as F
from torch_tpu._internal import execution_mode as em
from torch_tpu._internal import profiler
from torch_tpu._internal.utils import utils

out = {}


def error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return {"type": type(e).__name__, "message": str(e)}
    return None


# get_started_tpu: bf16 factories and a matmul of the page's size are tpu tensors of the right shape
a = torch.ones((1024, 1024), device="tpu", dtype=torch.bfloat16)
b = torch.randn((1024, 1024), device="tpu", dtype=torch.bfloat16)
c = torch.matmul(a, b)
out["matmul"] = [list(c.shape), str(c.device), str(c.dtype), str(c.cpu().device)]

# error_glossary: bad shapes and dtypes raise RuntimeError; a shape error is raised where the op is written,
# also while ops are deferred (the output shape is known when the op is recorded)
out["negative_dim"] = error_of(lambda: torch.ones(-1, device="tpu"))["type"]
with em.set_eager_mode(em.EagerMode.DEFER_AND_FUSE):
    x4, x5 = torch.randn(4, 8, device="tpu"), torch.randn(5, 3, device="tpu")
    out["mismatch_at_op"] = error_of(lambda: x4 @ x5)["type"]
out["mm_dtypes"] = error_of(
    lambda: torch.mm(torch.randn(4, 4, device="tpu"), torch.randint(0, 9, (4, 4), device="tpu")).cpu()
)["type"]

# api_mapping / compilation_cache: the HBM summary names executables (none held on the device) and live bytes
out["hbm_summary"] = torch.tpu._hbm_usage_summary()

# performance_profiling: the profiler's refusals; torch.tpu.profiler (torch >= 2.12 config) is not provided
out["gpu_activity"] = error_of(
    lambda: profiler.profile(
        activities=[profiler.ProfilerActivity.GPU], on_trace_ready=profiler.xprof_trace_handler(dir_name="/nonexistent")
    ).__enter__()
)
out["no_handler"] = error_of(lambda: profiler.profile(activities=[profiler.ProfilerActivity.CPU]).__enter__())
out["tpu_profiler_module"] = hasattr(torch.tpu, "profiler")
with profiler.profile(activities=[profiler.ProfilerActivity.CPU], on_trace_ready=profiler.xprof_trace_handler("xprof")):
    out["nested_profile"] = error_of(
        lambda: profiler.profile(on_trace_ready=profiler.xprof_trace_handler("xprof")).__enter__()
    )

# api_mapping: seeding every device reproduces the device's draws
torch.tpu.manual_seed_all(42)
first = torch.randn(3, device="tpu").cpu()
torch.tpu.manual_seed_all(42)
out["seeded"] = torch.equal(first, torch.randn(3, device="tpu").cpu())

# modules of the wheel the face does not provide
out["not_provided"] = {
    name: importlib.util.find_spec(name) is None
    for name in ("torch_tpu._internal.pallas", "torch_tpu._internal.distributed", "torch_tpu._internal.compile")
}

# numerical_parity: copied weights, same dtype: the tpu result is the CPU one within the page's tolerance
torch.manual_seed(0)
cpu_model = torch.nn.Linear(10, 10)
tpu_model = torch.nn.Linear(10, 10).to("tpu")
tpu_model.load_state_dict(cpu_model.state_dict())
inputs = torch.randn(5, 10)
utils.assert_close(tpu_model(inputs.to("tpu")).cpu(), cpu_model(inputs), atol=5e-3, rtol=1e-3)
out["parity"] = True

# precision_management: eager bf16 @ bf16 rounds the product to bf16 before an f32 multiply
one_plus = 1.0 + torch.finfo(torch.bfloat16).eps
square = torch.tensor([[one_plus, 0.0], [0.0, one_plus]], device="tpu", dtype=torch.bfloat16)
out["bf16_product"] = (torch.mm(square, square) * torch.ones(1, device="tpu"))[0, 0].item()

# porting_vit_mnist: interpolate, a tiny ViT trained with Adam, inference with argmax().cpu().item()
images = F.interpolate(torch.rand(8, 1, 28, 28, device="tpu"), size=(32, 32), mode="bilinear")
labels = torch.randint(0, 10, (8,), device="tpu")


class TinyViT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.patches = torch.nn.Conv2d(1, 16, kernel_size=8, stride=8)
        self.norm = torch.nn.LayerNorm(16)
        self.qkv = torch.nn.Linear(16, 48)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        q, k, v = self.qkv(self.norm(tokens)).chunk(3, dim=-1)
        attention = torch.softmax(q @ k.transpose(1, 2) / 4.0, dim=-1) @ v
        tokens = tokens + attention + F.scaled_dot_product_attention(q, k, v)
        tokens = tokens + self.mlp(self.norm(tokens))
        return self.head(tokens.mean(1))


vit = TinyViT().to("tpu")
adam = torch.optim.Adam(vit.parameters(), lr=1e-2)
losses = []
for _ in range(8):
    adam.zero_grad()
    loss = F.cross_entropy(vit(images), labels)
    loss.backward()
    adam.step()
    losses.append(loss.detach())
out["vit_losses"] = [losses[0].item(), losses[-1].item()]
with torch.no_grad():
    out["vit_prediction"] = type(vit(images[:1]).argmax(-1).cpu().item()).__name__


# extending_modules...: a straight-through estimator composed of torch ops; pack32 / unpack32 with vmap on int32
def fake_quantize(w):
    return w + (torch.round(w * 4) / 4 - w).detach()


weight = torch.randn(3, 3, device="tpu", requires_grad=True)
fake_quantize(weight).sum().backward()
out["straight_through_grad"] = bool((weight.grad.cpu() == 1).all())
shifts = torch.arange(32, dtype=torch.int32, device="tpu")


def pack32(bits):
    return (bits.to(torch.int32) << shifts).sum(dtype=torch.int32)


def unpack32(word):
    return (word >> shifts) & 1


bits = torch.randint(0, 2, (4, 32), dtype=torch.int32, device="tpu")
words = torch.vmap(pack32)(bits)
out["pack_roundtrip"] = bool((torch.vmap(unpack32)(words) == bits).all().item())
out["uint32_arange"] = error_of(lambda: 2 ** torch.arange(32, dtype=torch.uint32, device="tpu"))


# customizing_autograd...: a Function with its own backward, eager and compiled with the tpu backend
class ClampedSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.sigmoid(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        inside = (y > 0.1) & (y < 0.9)
        return grad * torch.where(inside, torch.full_like(y, 0.25), torch.full_like(y, 0.01))


def clamped_grads(fn):
    x = torch.tensor([-5.0, 0.0, 5.0], device="tpu", requires_grad=True)
    fn(x).sum().backward()
    return x.grad.cpu().tolist()


out["custom_backward"] = clamped_grads(ClampedSigmoid.apply)
out["custom_backward_compiled"] = clamped_grads(torch.compile(ClampedSigmoid.apply, backend="tpu"))


# quantized_sum: a Python custom op with a fake kernel, eager and inside a compiled graph
@torch.library.custom_op("tpu_agent_guide::double_sum", mutates_args=())
def double_sum(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum(0)


@double_sum.register_fake
def _(x):
    return x.new_empty(x.shape[1:])


ones = torch.ones(3, 2, device="tpu")
out["custom_op"] = [double_sum(ones).cpu().tolist(), torch.compile(lambda t: double_sum(t) + 1, backend="tpu")(ones).cpu().tolist()]

# advanced_compile / error_glossary: explain counts the graph break at the host read; a step whose Adam is not
# capturable still trains here; switching eager modes or profiling inside a compiled function is refused


def breaks(x):
    x = x + 1
    print(f"mean {x.mean().item()}")
    return x * 2


out["explain_graphs"] = torch._dynamo.explain(breaks)(torch.randn(4, 4, device="tpu")).graph_count
net = torch.nn.Linear(4, 2).to("tpu")
plain_adam = torch.optim.Adam(net.parameters(), lr=0.1)


@torch.compile(backend="tpu")
def train_step(data, target):
    plain_adam.zero_grad()
    loss = F.mse_loss(net(data), target)
    loss.backward()
    plain_adam.step()
    return loss.detach()


data, target = torch.randn(8, 4, device="tpu"), torch.randn(8, 2, device="tpu")
out["uncapturable_losses"] = [train_step(data, target).item() for _ in range(4)]


def switches(x):
    with em.set_eager_mode(em.EagerMode.DEFER_NEVER):
        return x + 1


def switches_by_call(x):
    with em.eager_mode(em.EagerMode.DEFER_NEVER):
        return x + 1


def profiles(x):
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU], on_trace_ready=lambda _: "/nonexistent"):
        return x + 1


for name, fn in (("set_eager_mode", switches), ("eager_mode_call", switches_by_call), ("profile", profiles)):
    torch._dynamo.reset()
    error = error_of(lambda: torch.compile(fn, backend="tpu", fullgraph=True)(torch.ones(2, device="tpu")))
    out[f"compiled_{name}"] = error and [error["type"], "forbidden callable" in error["message"]]
print(json.dumps(out))
sys.stdout.flush()
