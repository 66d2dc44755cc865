"""The sequence-length churn of issue 27: a compiled lambda fed a batch whose length is drawn each step (CO-1 and SH-1
at `tokens`, sized by `seq`; never at the model). Its loss averages every position, so padding changes the numbers:
the padding diff must be withheld, the advice kept in words."""

import random

import torch
import torch.nn as nn

random.seed(0)
dev = torch.device("tpu")
model = nn.Sequential(nn.Embedding(512, 128), nn.Linear(128, 128)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step_fn = torch.compile(lambda t: model(t).float().pow(2).mean(), backend="tpu")  # COMPILED: CO-1
for step in range(24):
    seq = random.randint(17, 200)  # DRIVER: CO-1
    tokens = torch.randint(0, 512, (8, seq), device=dev)  # SEED: CO-1
    loss = step_fn(tokens)
    loss.backward()
    opt.step()
    opt.zero_grad()
