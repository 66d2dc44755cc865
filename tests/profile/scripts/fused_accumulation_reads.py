"""Seeded problem: a regression trainer that accumulates gradients over micro-batches in Fused eager, switched on in
the script the way TorchTPU's docs show (``torch.tpu.eager_mode = ...``), and reads each micro-batch's loss with
``.item()`` to log a running mean. Every read materialises the pending graph in the middle of the step, so the step
runs as one small graph per micro-batch (EM-2 at the `.item()` line). Keeping the running loss on the device and
reading it once per log line keeps the step fused and the losses the same."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).squeeze(-1)


def train_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer, micro_batches: int) -> float:
    device = next(model.parameters()).device
    running_loss = 0.0
    for x, y in loader:
        for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True):
            loss = nn.functional.mse_loss(model(xs.to(device)), ys.to(device)) / micro_batches
            loss.backward()
            running_loss += loss.item()  # SEED: EM-2
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return running_loss / len(loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)  # 8 steps: the window (2 warm-up + 5) and one more
    args = parser.parse_args()
    torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(512, args.features, generator=generator)
    data = TensorDataset(inputs, inputs[:, :4].sum(-1) + 0.1 * torch.randn(512, generator=generator))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False, drop_last=True)
    model = Regressor(args.features, args.hidden).to(torch.device("tpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        mean_loss = train_epoch(model, loader, optimizer, args.micro_batches)
        print(f"epoch {epoch}: loss {mean_loss:.4f}")


if __name__ == "__main__":
    main()
