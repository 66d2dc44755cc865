"""Seeded problem: fine-tuning a classifier whose pretrained backbone is frozen for the first epoch (linear probing)
and unfrozen after, with the whole model under torch.compile(backend="tpu"). Unfreezing flips the backbone
parameters' requires_grad, which the compiled graph is guarded on, so the step recompiles after warm-up (CO-1 at the
line that unfreezes, with the compiled model's call after it)."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Backbone(nn.Module):
    def __init__(self, features: int, width: int) -> None:
        super().__init__()
        self.stem = nn.Linear(features, width)
        self.blocks = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x))


class Classifier(nn.Module):
    def __init__(self, features: int, width: int, classes: int) -> None:
        super().__init__()
        self.backbone = Backbone(features, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def set_backbone_trainable(model: Classifier, trainable: bool) -> None:
    for parameter in model.backbone.parameters():
        parameter.requires_grad_(trainable)  # SEED: CO-1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--probe-epochs", type=int, default=1, help="epochs with the backbone frozen")
    args = parser.parse_args()
    device = torch.device("tpu")
    generator = torch.Generator().manual_seed(11)
    data = TensorDataset(
        torch.randn(128, args.features, generator=generator),
        torch.randint(0, args.classes, (128,), generator=generator),
    )
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False, drop_last=True)
    model = Classifier(args.features, args.width, args.classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    compiled = torch.compile(model, backend="tpu")  # COMPILED: CO-1
    for epoch in range(args.epochs):
        set_backbone_trainable(model, epoch >= args.probe_epochs)
        for x, y in loader:
            loss = nn.functional.cross_entropy(compiled(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


if __name__ == "__main__":
    main()
