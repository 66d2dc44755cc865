"""A compiled model trained in DeferAndFuse with the XLA compiler, as nanoGPT and build-nanogpt run it: embedding
and linear layers, a bf16 autocast region around the compiled call, forward, backward and an optimizer step,
then an evaluation under torch.no_grad (a second graph, traced while the optimizer's writes are still pending).
The same run in Strict mode is the reference. Run by ``tpu-agent run --compiler xla``.

Dynamo and AOTAutograd trace the compiled model on tpu tensors over fake and functional data; DeferAndFuse once
recorded those ops into its pending graph and flushed them with the trace's tensors, so the compile fell back to
running op by op (or failed outright). Prints one JSON line: per mode, the training and evaluation losses, the
names of the model's XLA executables that ran and the FallbackOp records of the run.
"""

import json
import os

import torch
import torch.nn.functional as F
from torch import nn

from tpu_agent.runtime import events

torch.set_float32_matmul_precision("highest")
VOCAB, BLOCK, DIM = 32, 8, 16


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, DIM)
        self.positions = nn.Embedding(BLOCK, DIM)
        self.hidden = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        logits = self.head(F.gelu(self.hidden(x)))
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def logged() -> list:
    events.get_log().flush()
    return events.read_events(os.environ["TPU_AGENT_EVENTS_DIR"]).get(0, [])


def train(mode: torch.tpu.EagerMode) -> dict:
    torch._dynamo.reset()  # each mode traces and compiles its own graphs
    seen = len(logged())
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    with torch.tpu.set_eager_mode(mode):
        model = TinyLM().to("tpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
        compiled = torch.compile(model)
        losses, evaluations = [], []
        for _ in range(3):
            batch = torch.randint(0, VOCAB, (4, BLOCK + 1), generator=generator).to("tpu")
            idx, targets = batch[:, :-1] % VOCAB, batch[:, 1:] % VOCAB  # computed on the device: deferred inputs
            with torch.autocast("tpu", dtype=torch.bfloat16):
                loss = compiled(idx, targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            with torch.no_grad(), torch.autocast("tpu", dtype=torch.bfloat16):
                evaluations.append(compiled(idx, targets).item())
    log = logged()[seen:]
    return {
        "losses": losses,
        "evaluations": evaluations,
        # the model's XLA executables that ran, built now or taken from the cache the Strict run filled
        "xla_graphs": sorted(
            {e.function for e in log if isinstance(e, (events.Compile, events.CacheHit)) and "[xla" in e.function}
        ),
        "fallbacks": [e.op for e in log if isinstance(e, events.FallbackOp)],
    }


print(
    json.dumps(
        {mode.name: train(mode) for mode in (torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE)}
    )
)
