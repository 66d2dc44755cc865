"""Seeded problem: the training loop keeps every step's loss tensor for a later average, and with it each step's
autograd graph and saved activations, so device memory grows step after step (SD-8 at the append)."""

import argparse

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    device = torch.device("tpu")
    model = nn.Sequential(Block(args.width), Block(args.width)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for step in range(args.steps):
        x = torch.randn(64, args.width).to(device)
        loss = model(x).square().mean()
        loss.backward(retain_graph=True)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss)  # SEED: SD-8
    print(f"mean loss {torch.stack(losses).mean().item():.4f}")


if __name__ == "__main__":
    main()
