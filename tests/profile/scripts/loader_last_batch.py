"""Seeded problem: a DataLoader whose dataset does not divide by the batch size, without drop_last, so every epoch
ends on a smaller batch (SH-1 at the DataLoader; the drop_last diff keeps the first losses and verifies)."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Regression(Dataset):
    """Fixed random features and targets (generated once)."""

    def __init__(self, size: int, features: int) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(size, features, generator=generator)
        self.y = torch.randn(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def make_loader(args: argparse.Namespace) -> DataLoader:
    return DataLoader(Regression(args.samples, args.features), batch_size=args.batch_size, shuffle=False)  # SEED: SH-1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    device = torch.device("tpu")
    model = nn.Sequential(nn.Linear(args.features, 128), nn.ReLU(), nn.Linear(128, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = make_loader(args)
    for _ in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


if __name__ == "__main__":
    main()
