"""A small transformer trained on the emulated tpu through XLA (torch.compile or DeferAndFuse) and on the CPU.

argv: one or more runs, each MODE:PRECISION:STEPS (mode compile | defer | strict, precision highest | medium),
all in this one process (the tests share its start-up and JIT warm-up). Prints one JSON line: per run, both
loss curves, the largest parameter difference, XLA compiles by step, and the run's own compile and cache-hit
records and cache counters.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import activate
from tpu_agent.runtime.xla import cache, settings

activate()
settings.install_deferred_executor()  # what tpu_agent.runtime.api.activate does for a run


class Block(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(16, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, t = tokens.shape
        # factories on the input's device, as GPT and TAPAS models build positions (they must stay on tpu when
        # compiled): while Dynamo traces, the arange meets a tpu tensor in one op (refused as "two devices, tpu:0
        # and tpu:0" once, a graph break), and Dynamo folds the as_tensor into a constant the backend reads
        positions = torch.min(torch.arange(t, device=tokens.device), torch.as_tensor(15, device=tokens.device))
        x = self.embed(tokens) + self.position(positions)
        d = x.shape[-1]
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


def compiles_so_far() -> int:
    return cache.executables.stats.compiles


def train(device: str, compiled: bool, steps: int) -> tuple[list[float], list[torch.Tensor], list[int]]:
    torch.manual_seed(0)
    model = Block().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    step_fn = torch.compile(model, backend="tpu") if compiled else model
    generator = torch.Generator().manual_seed(1)
    losses, compiles = [], []
    for _ in range(steps):
        tokens = torch.randint(0, 64, (4, 16), generator=generator)
        logits = step_fn(tokens.to(device))
        loss = F.cross_entropy(logits.reshape(-1, 64), tokens.roll(-1, 1).reshape(-1).to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        compiles.append(compiles_so_far())
    return losses, [p.detach().cpu() for p in model.parameters()], compiles


def is_xla(function: str) -> bool:
    """An XLA executable's compile record (Dynamo's own records name the user's function)."""
    return "[xla" in function or function.startswith("deferred")


def logged() -> list:
    events.get_log().flush()
    directory = os.environ.get("TPU_AGENT_EVENTS_DIR")
    return events.read_events(directory).get(0, []) if directory else []


def run(mode: str, precision: str, steps: int) -> dict:
    torch.set_float32_matmul_precision(precision)
    cpu_losses, cpu_params, _ = train("cpu", compiled=False, steps=steps)
    before, seen = dict(vars(cache.executables.stats)), len(logged())
    eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE if mode == "defer" else torch.tpu.EagerMode.DEFER_NEVER
    with torch.tpu.set_eager_mode(eager_mode):
        tpu_losses, tpu_params, compiles = train("tpu", compiled=mode == "compile", steps=steps)
    log = logged()[seen:]
    stats = {k: v - before[k] for k, v in vars(cache.executables.stats).items()}
    return {
        "cpu": cpu_losses,
        "tpu": tpu_losses,
        "max_param_diff": max(float((a - b).abs().max()) for a, b in zip(cpu_params, tpu_params, strict=True)),
        "compiles_after_step": [c - before["compiles"] for c in compiles],
        "compile_events": sum(1 for e in log if isinstance(e, events.Compile) and is_xla(e.function)),
        "cache_hit_events": sum(1 for e in log if isinstance(e, events.CacheHit)),
        "fallbacks": [e.op for e in log if isinstance(e, events.FallbackOp)],
        "graph_breaks": [e.reason for e in log if isinstance(e, events.GraphBreak)],
        "cache": {"requests": stats["requests"], "hits": stats["hits"], "compiles": stats["compiles"]},
    }


print(json.dumps({spec: run(spec.split(":")[0], spec.split(":")[1], int(spec.split(":")[2])) for spec in sys.argv[1:]}))
