"""Errors raised beneath backward nodes of tpu tensors, eager and compiled (run with TPU_AGENT_COMPILER=xla):
each must reach the caller as a Python exception, or fall back, never abort the process. Prints one JSON line:
what each eager backward raised, and each compiled model's largest difference from CPU."""

import copy
import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tpu_agent.runtime.emulated import activate
from tpu_agent.runtime.xla import settings

activate()
settings.install_deferred_executor()
torch.set_float32_matmul_precision("highest")


def raised(backward) -> list:
    try:
        backward()
    except Exception as error:  # what the caller sees is the point
        return [type(error).__name__, str(error)]
    return []


def hook_error() -> list:
    """A tensor hook raising during a tpu backward."""
    x = torch.randn(3, 4, device="tpu", requires_grad=True)
    y = x * 2

    def refuse(grad: torch.Tensor) -> torch.Tensor:
        raise ValueError("hook refused the gradient")

    y.register_hook(refuse)
    return raised(lambda: (y * 3).sum().backward())


class RefuseIndex(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.index.Tensor:
            raise RuntimeError("index refused")
        return func(*args, **(kwargs or {}))


def dispatch_error() -> list:
    """An error from the dispatcher while a built-in backward node runs (IndexPutBackward0's index)."""
    x = torch.randn(3, 4, device="tpu", requires_grad=True)
    v = torch.tensor(1.0, device="tpu", requires_grad=True)
    y = x * 2
    y[x > 0] = v
    loss = y.sum()
    with RefuseIndex():
        return raised(loss.backward)


class MarkedEmbedding(torch.nn.Embedding):
    """T5Gemma2's scaled word embedding: rows of one token id replaced by a learned vector (x[mask] = v)."""

    def __init__(self, marked: int) -> None:
        super().__init__(10, 4)
        self.marked = marked
        self.marker = torch.nn.Parameter(torch.randn(4))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        embedded = super().forward(ids) * 2.0
        embedded[ids == self.marked] = self.marker.to(embedded.dtype)
        return embedded


@torch.library.custom_op("backward_errors::cube", mutates_args=())
def cube(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(x.detach().cpu().numpy() ** 3).to(x.device)


@cube.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _save_input(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _cube_backward(ctx, grad: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors  # a gradient formula through numpy: AOTAutograd cannot trace it
    return grad * torch.from_numpy(3 * x.detach().cpu().numpy() ** 2).to(grad.device)


cube.register_autograd(_cube_backward, setup_context=_save_input)


class Cubed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cube(self.linear(x)).sum(-1)


def compiled_vs_cpu(model: torch.nn.Module, inputs: torch.Tensor) -> float:
    """The largest difference between CPU and the compiled tpu model, over the output and every gradient."""
    device_model = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    out = model(inputs)
    out.sum().backward()
    device_out = device_model(inputs.to("tpu"))
    device_out.sum().backward()
    pairs = [(device_out, out)] + [
        (p.grad, q.grad) for p, q in zip(device_model.parameters(), model.parameters(), strict=True)
    ]
    return max(float((a.cpu() - b).abs().max()) for a, b in pairs)


torch.manual_seed(0)
ids = torch.tensor([[1, 3, 5], [3, 2, 0]])
print(
    json.dumps(
        {
            "hook": hook_error(),
            "dispatch": dispatch_error(),
            "mask_hit": compiled_vs_cpu(MarkedEmbedding(3), ids),
            "mask_miss": compiled_vs_cpu(MarkedEmbedding(99), ids),  # the eoi token absent, as in a tiny config
            "custom_op": compiled_vs_cpu(Cubed(), torch.randn(3, 4)),
        }
    )
)
