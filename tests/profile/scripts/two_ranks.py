"""Two ranks on tpu_dist, each all-reducing its gradients by hand: one xplane and one collective log per rank."""

import torch
import torch.distributed as dist

dist.init_process_group("tpu_dist")
device = torch.device("tpu")
torch.manual_seed(0)
model = torch.nn.Linear(256, 256).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    loss = model(torch.randn(32, 256, device=device)).square().mean()
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)  # SEED: SD-2
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
