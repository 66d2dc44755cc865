"""Inference without an optimizer: steps come from `with tpu_agent.profile.step():` (none with --no-steps)."""

import contextlib
import sys

import torch

import tpu_agent.profile

annotate = "--no-steps" not in sys.argv
device = torch.device("tpu")
model = torch.nn.Linear(256, 256).to(device)
with torch.no_grad():
    for step in range(9):
        with tpu_agent.profile.step() if annotate else contextlib.nullcontext():
            y = model(torch.randn(32, 256, device=device)).relu()
