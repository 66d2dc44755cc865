"""No compile switch: the model is built in one branch of `if init_from == ...` and moved with `model.to`, then
wrapped only `if ddp:` (EM-3's inserted torch.compile belongs after the `.to`, at top level)."""

import torch

init_from = "scratch"
ddp = False


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


device = torch.device("tpu")
if init_from == "scratch":
    model = Net()
elif init_from == "resume":
    model = Net()
    model.load_state_dict(torch.load("ckpt.pt"))
model.to(device)  # SEED: EM-3
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
if ddp:
    model = torch.nn.parallel.DistributedDataParallel(model)
x = torch.randn(8, 32, device=device)
for step in range(8):
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
