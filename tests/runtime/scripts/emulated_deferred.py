"""DeferAndFuse: flush causes and user lines go to the event log; a bad op fails at the flush."""

import json

import torch

from tpu_agent.runtime.emulated import activate
from tpu_agent.runtime.emulated.flush_cause import FlushCause
from tpu_agent.runtime.emulated.tensor import flush_pending

activate(eager_mode="defer_and_fuse")
x = torch.randn(8, 8, device="tpu")
y = (x @ x + 1).relu()
pending = y._elem is None
value = y.sum().item()  # LINE item
text = str((y * 3)[0, :2])  # LINE print
cpu = y.cpu()  # LINE cpu
z = x * 2
flush_pending(FlushCause.COLLECTIVE)
if (z > 100).any():  # LINE bool
    pass
bad = torch.nn.functional.embedding(torch.tensor([0, 99]).to("tpu"), x)
try:
    bad.cpu()  # LINE failed
    error = None
except RuntimeError as e:
    error = str(e)
with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
    strict = (x + 1)._elem is not None
print(json.dumps({"pending": pending, "error": error, "strict_inside": strict, "mode_after": torch.tpu.eager_mode.name}))
