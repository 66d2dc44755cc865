"""Program semantics the XLA path must keep: each case runs in Strict mode and in DeferAndFuse (whose graphs
XLA compiles), and compiled with torch.compile(backend="tpu"); prints the results of each side by side."""

import json

import torch
import torch.nn.functional as F

from tpu_agent.runtime.emulated import activate
from tpu_agent.runtime.xla import settings

activate()
settings.install_deferred_executor()  # what tpu_agent.runtime.api.activate does for a run
torch.set_float32_matmul_precision("highest")
STRICT, FUSED = torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE


def views_and_mutation() -> list:
    a = torch.arange(12.0, device="tpu").reshape(3, 4)
    w = torch.ones(4, 4, device="tpu")
    wt = w.t()  # a view of a materialised tensor: the graph gets both as inputs over one storage
    row = a[1]
    row.mul_(10)  # through a view into the base
    b = a @ wt
    w.add_(1)  # written after a reader recorded: the reader must see the old values
    c = (w @ a.t())[0]
    total = torch.zeros(4, device="tpu")
    for i in range(3):
        total += a[i]
    a.transpose(0, 1)[2].zero_()
    return [a.cpu().tolist(), b.cpu().tolist(), c.cpu().tolist(), wt.cpu().tolist(), total.cpu().tolist()]


def optimizer_steps() -> list:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, foreach=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # a new lr float every step
    x = torch.linspace(-1, 1, 32 * 8).reshape(32, 8).to("tpu")
    losses = []
    for _ in range(4):
        loss = model(x).pow(2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # the norm's order must not become an input
        opt.step()
        opt.zero_grad(set_to_none=False)
        sched.step()
        losses.append(loss.item())
    return [losses, [p.detach().cpu().flatten().tolist()[:4] for p in model.parameters()]]


def deferred_dropout() -> list:
    """DeferAndFuse steps with dropout: its p stays a constant of the executable (the lowering tests p != 0; lifted
    into an input, the graph fell back to the CPU path) while the step's other float is lifted."""
    torch.manual_seed(0)
    x = torch.ones(64, 64).to("tpu")
    rates = []
    for scale in (1.5, 2.5):
        y = F.dropout(x * scale, p=0.25, training=True)
        rates.append(float((y == 0).float().mean().item()))
    return rates


def data_dependent() -> list:
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0]).to("tpu")
    kept = x[x > 0]
    return [kept.cpu().tolist(), torch.nonzero(x < 0).cpu().tolist()]


def compiled_cases() -> dict:
    torch.manual_seed(3)
    x = torch.rand(64, device="tpu") * 4

    def with_poisson(t: torch.Tensor) -> torch.Tensor:
        return (torch.poisson(t) * 2 + t).sum()  # LINE poisson

    torch.manual_seed(5)
    eager = float(with_poisson(x))
    torch.manual_seed(5)
    compiled = float(torch.compile(with_poisson, backend="tpu")(x))

    def dropped(t: torch.Tensor) -> torch.Tensor:
        return F.dropout(t, p=0.5, training=True)

    compiled_dropout = torch.compile(dropped, backend="tpu")
    torch.manual_seed(7)
    first = compiled_dropout(x).cpu()
    torch.manual_seed(7)
    again = compiled_dropout(x).cpu()
    other = compiled_dropout(x).cpu()
    zeros = float((first == 0).float().mean())
    return {
        "poisson": [eager, compiled],
        "dropout_reproducible": bool(torch.equal(first, again)),
        "dropout_fresh": not bool(torch.equal(first, other)),
        "dropout_rate": zeros,
        "dropout_scale": bool(torch.allclose(first[first != 0], x.cpu()[first != 0] * 2)),
    }


def data_dependent_in_graph() -> list:
    """Embedding rows picked by a mask inside a compiled graph (Dynamo keeps masked_select and nonzero in it
    with capture_dynamic_output_shape_ops): the XLA pieces around them, the ops themselves on the CPU."""
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    torch.manual_seed(11)
    embed = torch.nn.Embedding(10, 4)
    tokens = torch.tensor([[1, 3, 5, 0, 7], [4, 2, 9, 8, 1]])

    def picked(module: torch.nn.Module, t: torch.Tensor) -> torch.Tensor:
        x = module(t)
        rows = torch.masked_select(x, (t > 2).unsqueeze(-1).expand_as(x)).view(-1, 4)  # LINE masked_select
        return (rows * rows).sum() + torch.nonzero(t).float().sum()

    results = []
    for device, step in (("cpu", picked), ("tpu", torch.compile(picked, backend="tpu"))):
        module = torch.nn.Embedding(10, 4).to(device)
        module.load_state_dict(embed.state_dict())
        loss = step(module, tokens.to(device))
        loss.backward()
        results.append([loss.item(), module.weight.grad.cpu().flatten().tolist()])
    torch._dynamo.config.capture_dynamic_output_shape_ops = False
    return results


def complex_rotary() -> list:
    """Llama 4's rotary embedding: a complex multiply, whose backward multiplies by the conjugate (a view torch
    keeps as a bit, not in the storage)."""
    torch.manual_seed(17)
    x = torch.randn(4, 6).to("tpu").requires_grad_()
    freqs = torch.polar(torch.ones(3), torch.randn(3)).to("tpu")
    y = torch.view_as_real(torch.view_as_complex(x.reshape(4, 3, 2)) * freqs).flatten(1)
    (y * torch.arange(24.0).reshape(4, 6).sin().to("tpu")).sum().backward()
    return [y.detach().cpu().flatten().tolist(), x.grad.cpu().flatten().tolist()]


def written_input_returned() -> list:
    """A compiled function that adds into its input and returns it (transformers' grouped-MoE linear, resumed after
    its ``_grouped_mm`` graph break): the gradients of both inputs, used again after the call or not."""

    def add_bias(out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        out.add_(bias)
        return out

    results = []
    for device, step in (("cpu", add_bias), ("tpu", torch.compile(add_bias, backend="tpu"))):
        torch.manual_seed(13)
        x, bias = torch.randn(8, 4).to(device).requires_grad_(), torch.randn(8, 4).to(device).requires_grad_()
        for reuse in (False, True):
            x.grad = bias.grad = None
            hidden = x * 1.5
            loss = step(hidden, bias).square().sum() + (7 * hidden.sum() if reuse else 0)
            loss.backward()
            results.append([str(x.grad.device.type), x.grad.cpu().flatten().tolist(), bias.grad.cpu().flatten().tolist()])
    return results


def host_stream_after_attention() -> list:
    """The program's own random draws after attention without dropout: the CPU's, in every mode."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 8, 4).to("tpu")
    F.scaled_dot_product_attention(q, q, q, is_causal=True).cpu()
    return torch.randint(100, (4,)).tolist()


def sliding_batches() -> list:
    """Batches sliced from one dataset tensor at a new offset every step (word_language_model's get_batch), and a
    write through a moving window of a larger buffer: one executable serves every step, with Strict's values."""
    from tpu_agent.runtime.xla import cache

    torch.manual_seed(0)
    source = torch.randint(0, 50, (64, 4)).to("tpu")
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50)).to("tpu")
    history = torch.zeros(48, device="tpu")
    losses, compiles = [], []
    for i in range(0, 48, 8):
        data, target = source[i : i + 8], source[i + 1 : i + 9].reshape(-1)
        loss = F.cross_entropy(model(data).reshape(-1, 50), target)
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.5)
            p.grad = None
        history[i : i + 8].add_(loss.detach())
        losses.append(loss.item())
        compiles.append(cache.executables.stats.compiles)
    return [losses, history.cpu().tolist(), compiles]


def overlapping_chunks() -> list:
    """Longformer's chunking: ``as_strided`` with overlapping windows over a transposed, reshaped view, which
    reads the storage under the view (eager for that op under XLA), compiled and not."""

    def chunks(t: torch.Tensor) -> torch.Tensor:
        q = t.transpose(0, 1).transpose(1, 2).reshape(4, 8, 4)  # a view of t's storage, not a copy
        q = q.view(4, 2, 4, 4)
        return q.as_strided(size=(4, 3, 4, 4), stride=(q.stride(0), q.stride(1) // 2, q.stride(2), q.stride(3))) * 1

    base = torch.arange(128.0).reshape(8, 2, 2, 4).to("tpu")
    return [chunks(base * 1).cpu().tolist(), torch.compile(chunks, backend="tpu")(base * 1).cpu().tolist()]


def run(mode: torch.tpu.EagerMode, case) -> list:
    with torch.tpu.set_eager_mode(mode):
        return case()


out = {
    name: [run(STRICT, case), run(FUSED, case)]
    for name, case in [
        ("views", views_and_mutation),
        ("optimizer", optimizer_steps),
        ("data_dependent", data_dependent),
        ("host_stream", host_stream_after_attention),
        ("sliding", sliding_batches),
        ("chunks", overlapping_chunks),
        ("complex_rotary", complex_rotary),
    ]
}
out["deferred_dropout"] = run(FUSED, deferred_dropout)
out["compiled"] = compiled_cases()
out["data_dependent_in_graph"] = data_dependent_in_graph()
out["written_input"] = written_input_returned()
from tpu_agent.runtime import events
from tpu_agent.runtime.xla import cache

events.get_log().flush()
import os

log = events.read_events(os.environ["TPU_AGENT_EVENTS_DIR"]).get(0, [])
out["fallbacks"] = [
    [e.op, e.site.file.rsplit("/", 1)[-1] if e.site else None, e.site.line if e.site else None]
    for e in log
    if isinstance(e, events.FallbackOp)
]
out["compiles"] = cache.executables.stats.compiles
print(json.dumps(out))
