"""Seeded problems: a compiled training step that recompiles after warm-up, for two reasons public scripts share:
a Python float argument that changes every step (a warm-up factor; CO-1 at the call passing it) and a layer unfrozen
part-way through (its parameters' requires_grad changes, one more recompile)."""

import argparse

import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.body = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.embed(x))


def warmup_factor(step: int, warmup: int) -> float:
    return min(1.0, (step + 1) / warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--unfreeze-at", type=int, default=4)
    args = parser.parse_args()
    device = torch.device("tpu")
    model = Encoder(args.width).to(device)
    model.embed.requires_grad_(False)  # frozen at first, trained later
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend="tpu")
    def train_step(x: torch.Tensor, scale: float) -> torch.Tensor:
        return model(x).square().mean() * scale

    generator = torch.Generator().manual_seed(4)
    for step in range(args.steps):
        if step == args.unfreeze_at:
            model.embed.requires_grad_(True)  # SEED: requires_grad
        x = torch.randn(32, args.width, generator=generator).to(device)
        loss = train_step(x, warmup_factor(step, args.warmup))  # SEED: CO-1
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
