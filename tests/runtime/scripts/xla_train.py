"""A small transformer trained on the emulated tpu through XLA (torch.compile or DeferAndFuse) and on the CPU.

argv: mode (compile | defer | strict), precision (highest | medium), steps. Prints one JSON line: both loss
curves, the largest parameter difference, compile events by step, the XLA cache counters.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from tpu_agent.runtime.emulated import activate
from tpu_agent.runtime.xla import settings

MODE, PRECISION, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3])
activate(eager_mode="defer_and_fuse" if MODE == "defer" else None)
settings.install_deferred_executor()  # what tpu_agent.runtime.api.activate does for a run
torch.set_float32_matmul_precision(PRECISION)


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
        # a factory on the input's device, as GPT models build positions (must stay on tpu when compiled)
        x = self.embed(tokens) + self.position(torch.arange(t, device=tokens.device))
        d = x.shape[-1]
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


def compiles_so_far() -> int:
    from tpu_agent.runtime.xla import cache

    return cache.executables.stats.compiles


def train(device: str, compiled: bool) -> tuple[list[float], list[torch.Tensor], list[int]]:
    torch.manual_seed(0)
    model = Block().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    step_fn = torch.compile(model, backend="tpu") if compiled else model
    generator = torch.Generator().manual_seed(1)
    losses, compiles = [], []
    for _ in range(STEPS):
        tokens = torch.randint(0, 64, (4, 16), generator=generator)
        logits = step_fn(tokens.to(device))
        loss = F.cross_entropy(logits.reshape(-1, 64), tokens.roll(-1, 1).reshape(-1).to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        compiles.append(compiles_so_far())
    return losses, [p.detach().cpu() for p in model.parameters()], compiles


cpu_losses, cpu_params, _ = train("cpu", compiled=False)
tpu_losses, tpu_params, compiles = train("tpu", compiled=MODE == "compile")
from tpu_agent.runtime import events
from tpu_agent.runtime.xla import cache

events.get_log().flush()
log = (
    events.read_events(os.environ["TPU_AGENT_EVENTS_DIR"]).get(0, []) if os.environ.get("TPU_AGENT_EVENTS_DIR") else []
)
stats = cache.executables.stats
print(
    json.dumps(
        {
            "cpu": cpu_losses,
            "tpu": tpu_losses,
            "max_param_diff": max(float((a - b).abs().max()) for a, b in zip(cpu_params, tpu_params)),
            "compiles_after_step": compiles,
            "compile_events": sum(
                1
                for e in log
                if isinstance(e, events.Compile) and ("[xla" in e.function or e.function.startswith("deferred"))
            ),
            "cache_hit_events": sum(1 for e in log if isinstance(e, events.CacheHit)),
            "fallbacks": [e.op for e in log if isinstance(e, events.FallbackOp)],
            "cache": {"requests": stats.requests, "hits": stats.hits, "compiles": stats.compiles},
        }
    )
)
