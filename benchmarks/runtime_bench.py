"""Emulated ``tpu`` device vs plain CPU PyTorch: the same training steps, side by side, in one run.

Each configuration runs in a fresh subprocess (the emulation is per process, and the CPU baseline must not
pay for it): plain CPU, then the emulated device in Strict and in DeferAndFuse eager mode, for a small MLP
(dispatch-bound: many tiny ops, where per-op overhead shows) and a GPT-style model (d_model 512, 6 layers,
sequence 256: compute-bound, the target case). Every step is forward, cross-entropy, backward, AdamW step
and ``loss.item()`` (the usual logging sync). The emulation keeps TorchTPU's default matmul precision
(f32 inputs rounded to bf16), so its numbers include that cost.

Target: emulated Strict <= 1.25x plain CPU on the GPT model.

    python benchmarks/runtime_bench.py [--steps 5] [--warmup 2] [--models mlp,gpt]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODES = ("cpu", "strict", "defer-and-fuse")
TARGET = {"gpt": 1.25}


def build(model_name: str, device: str):  # noqa: ANN201 - torch is imported lazily, in the child
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    if model_name == "mlp":
        layers: list[nn.Module] = []
        for _ in range(8):
            layers += [nn.Linear(64, 64), nn.GELU()]
        model = nn.Sequential(*layers, nn.Linear(64, 10))
        x = torch.randn(16, 64)
        y = torch.randint(0, 10, (16,))
        return model.to(device), x.to(device), y.to(device), lambda m, a: m(a)

    d_model, layers_n, heads, seq, vocab, batch = 512, 6, 8, 256, 2048, 4

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.ln2 = nn.LayerNorm(d_model)
            self.fc = nn.Linear(d_model, 4 * d_model)
            self.out = nn.Linear(4 * d_model, d_model)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            b, t, _ = h.shape
            q, k, v = self.qkv(self.ln1(h)).split(d_model, dim=-1)
            q, k, v = (z.view(b, t, heads, d_model // heads).transpose(1, 2) for z in (q, k, v))
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + self.proj(attn.transpose(1, 2).reshape(b, t, d_model))
            return h + self.out(F.gelu(self.fc(self.ln2(h))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(seq, d_model)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers_n)])
            self.ln = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(idx.shape[1], device=idx.device)
            return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(positions))))

    x = torch.randint(0, vocab, (batch, seq))
    y = torch.randint(0, vocab, (batch, seq))
    return GPT().to(device), x.to(device), y.to(device), lambda m, a: m(a).flatten(0, 1)


def child(model_name: str, mode: str, steps: int, warmup: int) -> None:
    """Time ``steps`` training steps after ``warmup`` and print one JSON line."""
    device = "cpu"
    if mode != "cpu":
        from tpu_agent.runtime.api import activate

        activate()
        device = "tpu"
    import torch
    import torch.nn.functional as F

    model, x, y, forward = build(model_name, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        loss = F.cross_entropy(forward(model, x), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    times.sort()
    print(json.dumps({"model": model_name, "mode": mode, "median_s": times[len(times) // 2], "min_s": times[0]}))


def run_child(model_name: str, mode: str, steps: int, warmup: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_AGENT_"))}
    if mode != "cpu":
        from tpu_agent.runtime.envvars import BACKEND_ENV, eager_mode_env

        env[BACKEND_ENV] = "emulated"
        env.update({k: v for k, v in eager_mode_env(mode).items() if v is not None})
    result = subprocess.run(
        [sys.executable, __file__, "--child", model_name, mode, "--steps", str(steps), "--warmup", str(warmup)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{model_name}/{mode} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--models", default="mlp,gpt")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.steps, args.warmup)
        return
    print(f"{'model':<6} {'mode':<16} {'median step':>12} {'vs cpu':>8}  target")
    for model_name in args.models.split(","):
        baseline = None
        for mode in MODES:
            measured = run_child(model_name, mode, args.steps, args.warmup)
            baseline = baseline or measured["median_s"]
            ratio = measured["median_s"] / baseline
            target = TARGET.get(model_name) if mode == "strict" else None
            verdict = "" if target is None else f"<= {target}x {'met' if ratio <= target else 'MISSED'}"
            print(f"{model_name:<6} {mode:<16} {measured['median_s'] * 1e3:>10.1f}ms {ratio:>7.2f}x  {verdict}", flush=True)


if __name__ == "__main__":
    main()
