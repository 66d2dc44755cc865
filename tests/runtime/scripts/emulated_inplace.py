"""In-place writes under DeferAndFuse: every form must read back the values Strict mode gives.

Each case builds tpu tensors and returns the ones to read. It runs once in Strict mode and twice in
DeferAndFuse: read by host reads (``tolist``/``item``), and through ``tensor.unwrap`` (the API collectives
use). Tensors created by factories (``torch.zeros`` = an allocation plus a recorded ``zero_``) and parameters
keep their data while in-place ops on them are pending, which is where writes used to be lost.
"""

import json

import torch

from tpu_agent.runtime.emulated import activate, deferred
from tpu_agent.runtime.emulated.tensor import unwrap

activate(eager_mode="strict")
DEV = "tpu"


def accumulate_into_zeros() -> list:
    total = torch.zeros((), device=DEV)
    for _ in range(3):
        total += torch.ones((), device=DEV) * 2
    return [total]


def add_method() -> list:
    x = torch.arange(4.0, device=DEV)
    x.add_(x * 2, alpha=0.5)
    return [x]


def mul_method() -> list:
    x = torch.full((4,), 1.5, device=DEV)
    x.mul_(3)
    return [x]


def slice_iadd_on_factory_tensor() -> list:
    x = torch.zeros(4, device=DEV)
    x[1:3] += 1
    return [x]


def slice_iadd_on_deferred_tensor() -> list:
    x = torch.arange(4.0, device=DEV) * 10
    x[1:3] += 1
    return [x]


def copy_from_device() -> list:
    x = torch.zeros(3, device=DEV)
    x.copy_(torch.ones(3, device=DEV) * 5)
    return [x]


def copy_from_host_while_pending_reader() -> list:
    x = torch.zeros(3, device=DEV)
    before = x + 1  # recorded; must see the zeros, not the upload below
    x.copy_(torch.arange(3.0))
    return [before, x]


def host_scalar_tensors_changed_after_use() -> list:
    x = torch.zeros((), device=DEV)
    before = x + 1
    host = torch.tensor(3.0)
    x.copy_(host)  # x has a pending reader, so the upload joins the graph
    scale = torch.tensor(2.0)
    scaled = torch.ones(2, device=DEV) * scale
    host += 1
    scale += 5  # later host writes must not reach ops recorded before them
    return [before, x, scaled]


def out_argument() -> list:
    a = torch.ones(3, device=DEV)
    c = torch.empty(3, device=DEV)
    torch.add(a, a * 2, out=c)
    return [c]


def parameter_update_under_no_grad() -> list:
    p = torch.nn.Parameter(torch.ones(3, device=DEV))
    g = torch.full((3,), 2.0, device=DEV)
    with torch.no_grad():
        p.add_(g, alpha=-0.1)
        p.mul_(0.5)
    return [p]


def optimizer_steps() -> list:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.randn(8, 4).to(DEV)
    for _ in range(3):
        opt.zero_grad()
        model(data).square().mean().backward()
        opt.step()
    return [model.weight, model.bias]


def view_read_after_inplace() -> list:
    x = torch.ones(2, 3, device=DEV)
    x.mul_(2)
    x[1].add_(1)
    return [x[0], x.t(), x.view(-1)[4]]


def write_through_detached_alias() -> list:
    x = torch.zeros(3, device=DEV)
    d = x.detach()
    d += 4
    return [x]


def inplace_chain_on_deferred_value() -> list:
    y = torch.arange(3.0, device=DEV) * 2
    y += 1
    y.mul_(2)
    return [y]


CASES = [
    accumulate_into_zeros,
    add_method,
    mul_method,
    slice_iadd_on_factory_tensor,
    slice_iadd_on_deferred_tensor,
    copy_from_device,
    copy_from_host_while_pending_reader,
    host_scalar_tensors_changed_after_use,
    out_argument,
    parameter_update_under_no_grad,
    optimizer_steps,
    view_read_after_inplace,
    write_through_detached_alias,
    inplace_chain_on_deferred_value,
]


def host_read(t: torch.Tensor) -> object:
    return t.item() if t.dim() == 0 else t.tolist()


def unwrap_read(t: torch.Tensor) -> object:
    return unwrap(t).tolist()


def run(case, read) -> tuple[list, int]:
    tensors = case()
    pending = len(deferred._pending)
    return [read(t) for t in tensors], pending


results = {}
for case in CASES:
    strict, _ = run(case, host_read)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        defer_host, pending = run(case, host_read)
        defer_unwrap, _ = run(case, unwrap_read)
    results[case.__name__] = {"strict": strict, "defer_host": defer_host, "defer_unwrap": defer_unwrap, "pending_ops": pending}
print(json.dumps(results))
