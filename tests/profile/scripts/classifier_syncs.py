"""Seeded problems: a classifier's training loop that reads the device every step to log (HS-2 `print(loss)`, HS-2
`.cpu()` into a history, HS-1 `.tolist()` of the predictions). Each read is only shown or kept for later, so running
it every tenth step is the fix, and it keeps the losses: the diffs verify."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class MLP(nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(features, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    device = torch.device("tpu")
    generator = torch.Generator().manual_seed(3)
    data = TensorDataset(
        torch.randn(320, args.features, generator=generator),
        torch.randint(0, args.classes, (320,), generator=generator),
    )
    loader = DataLoader(data, batch_size=args.batch_size, drop_last=True)
    model = MLP(args.features, args.classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    history: list[torch.Tensor] = []
    seen: list[list[int]] = []
    for step, (x, y) in enumerate(loader):
        logits = model(x.to(device))
        loss = nn.functional.cross_entropy(logits, y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(loss)  # SEED: HS-2
        history.append(loss.detach().cpu())  # SEED: HS-2b
        seen.append(logits.argmax(-1).tolist())  # SEED: HS-1
    print(f"trained {len(history)} steps, {sum(len(s) for s in seen)} predictions")


if __name__ == "__main__":
    main()
