"""A small GPT trained the way public scripts write it (nanoGPT-style): the device from ``torch.accelerator``,
``nn.Embedding``, RMSNorm or LayerNorm, ``F.scaled_dot_product_attention(is_causal=True)``, a SwiGLU MLP, AdamW,
random tokens made on the device and ``loss.item()`` printed every step; ``--checkpointing`` wraps each block
in ``torch.utils.checkpoint``.

The defaults are the toy model of the estimate's tests (d128 x 2 layers, seq 64); ``--preset 0.7b`` is a
0.7B-parameter GPT (d2048 x 12 layers, batch 16, seq 2048) that a laptop cannot train for real."""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

PRESETS = {"0.7b": {"d_model": 2048, "layers": 12, "heads": 16, "batch": 16, "seq": 2048}}


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, d_model // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, seq, d_model))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int) -> None:
        super().__init__()
        hidden = int(8 * d_model / 3)
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, norm: type[nn.Module]) -> None:
        super().__init__()
        self.norm1 = norm(d_model)
        self.attn = Attention(d_model, heads)
        self.norm2 = norm(d_model)
        self.mlp = SwiGLU(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(
        self, vocab: int, d_model: int, layers: int, heads: int, seq: int, norm: str, checkpointing: str = "none"
    ) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.preserve_rng = True
        norm_class = nn.RMSNorm if norm == "rmsnorm" else nn.LayerNorm
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads, norm_class) for _ in range(layers)])
        self.norm = norm_class(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied embeddings
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        for block in self.blocks:
            if self.checkpointing == "none":
                x = block(x)
            else:  # each block's activations are recomputed in the backward
                x = torch.utils.checkpoint.checkpoint(
                    block, x, use_reentrant=self.checkpointing == "reentrant", preserve_rng_state=self.preserve_rng
                )
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--d-model", dest="d_model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--norm", choices=("rmsnorm", "layernorm"), default="rmsnorm")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--no-preserve-rng", dest="preserve_rng", action="store_false", help="checkpoint(preserve_rng_state=False)"
    )
    parser.add_argument(
        "--checkpointing",
        choices=("none", "reentrant", "non-reentrant"),
        default="none",
        help="torch.utils.checkpoint around each block",
    )
    parser.add_argument("--lr", type=float, default=3e-4)
    args = parser.parse_args()
    for name, value in PRESETS.get(args.preset or "", {}).items():
        setattr(args, name, value)
    return args


def main() -> None:
    args = parse_args()
    device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    model = GPT(args.vocab, args.d_model, args.layers, args.heads, args.seq, args.norm, args.checkpointing).to(
        device
    )
    model.preserve_rng = args.preserve_rng
    print(f"parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} (ln vocab {math.log(args.vocab):.2f})")


if __name__ == "__main__":
    main()
