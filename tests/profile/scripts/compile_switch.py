"""nanoGPT's shape: a compile switch turned off by a flag and a DDP wrap that does not run (EM-3 names the switch)."""

import sys

import torch

compile = True  # use torch.compile
ddp = False
for arg in sys.argv[1:]:  # nanoGPT's configurator: --key=value overrides a setting
    key, value = arg[2:].split("=")
    globals()[key] = value == "True"


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


device = torch.device("tpu")
model = Net()
model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
if compile:
    model = torch.compile(model)  # SEED: compile
if ddp:
    model = torch.nn.parallel.DistributedDataParallel(model)
x = torch.randn(8, 32, device=device)
for step in range(8):
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
