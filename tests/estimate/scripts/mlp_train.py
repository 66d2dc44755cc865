"""A small TorchTPU training script (as `tpu-agent migrate` leaves one): an MLP trained with AdamW on 'tpu'.

``--hidden`` and ``--d-model`` size it; ``--meta-init`` is not used: the estimate tests size it to fit the host."""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--d-model", type=int, default=64)
parser.add_argument("--hidden", type=int, default=256)
args = parser.parse_args()

device = torch.device("tpu")
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(args.d_model, args.hidden), torch.nn.GELU(), torch.nn.Linear(args.hidden, args.d_model)
).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.steps):
    x = torch.randn(args.batch, args.d_model, device=device)
    loss = F.mse_loss(model(x), x)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
