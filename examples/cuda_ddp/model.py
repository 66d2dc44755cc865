"""A small GPT-style language model, written the way CUDA training code usually is."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # optional fused attention kernel, only present on CUDA machines
    from flash_attn import flash_attn_func
except ImportError:
    flash_attn_func = None

try:  # our own Triton GELU kernel (kernels/fused_gelu.py) needs triton
    from kernels.fused_gelu import fused_gelu
except ImportError:
    fused_gelu = None


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=2)
        q, k, v = (t.view(batch, seq, self.n_heads, d_model // self.n_heads) for t in (q, k, v))
        if flash_attn_func is not None and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
            out = flash_attn_func(q, k, v, causal=True)
        else:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        return self.proj(out.reshape(batch, seq, d_model))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        hidden = self.fc(self.ln2(x))
        hidden = fused_gelu(hidden) if fused_gelu is not None and hidden.is_cuda else F.gelu(hidden)
        return x + self.out(hidden)


class TinyGPT(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, max_seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.zeros(1, max_seq_len, d_model))
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def count_parameters(model: nn.Module) -> str:
    n = sum(p.numel() for p in model.parameters())
    return f"{n / 1e6:.2f}M parameters"
