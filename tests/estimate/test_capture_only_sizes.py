"""Capture-only's answer to sizes read from the device: a mixture-of-experts layer counts its tokens per expert
(``counts.tolist()``) and splits its tokens by them; the placeholder zeros no longer sum to the tokens, and the split
is bounded to an even one (stated in the assumptions), while a split whose wrong sizes are the script's own still
fails as on the device. Run without the TPU compiler: only the recording is under test."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_launch_util import run_script  # noqa: E402

SCRIPT = r"""
import json, torch
from tpu_agent.runtime.api import activate
activate()
from tpu_agent.estimate import capture_only
capture_only.install()
router = torch.nn.Linear(8, 4).to("tpu")  # built under capture-only: no data, nor has what it computes
tokens = router(torch.randn(30, 8, device="tpu"))
try:
    tokens.split([1, 2])  # the script's own wrong sizes
    own = "no error"
except RuntimeError as error:
    own = str(error)
counts = (tokens > 0).long().sum(0).tolist()
parts = tokens.split(counts)
print(json.dumps({"counts": counts, "parts": [p.shape[0] for p in parts], "own": own,
                  "assumptions": capture_only.reads.assumptions}))
"""


def test_sizes_read_from_the_device_are_bounded_to_an_even_split(tmp_path: Path) -> None:
    out = run_script(SCRIPT, tmp_path, TORCH_TPU_DEFER_AND_FUSE="1")
    assert out["counts"] == [0, 0, 0, 0], out  # placeholders: no values computed
    assert out["parts"] == [8, 8, 7, 7], out
    assert "split_with_sizes expects split_sizes to sum exactly to 30" in out["own"], out
    assert any("even split of 30 into 4 parts" in text for text in out["assumptions"]), out


UPDATE_SCRIPT = r"""
import json, torch
from tpu_agent.runtime.api import activate
activate()
from tpu_agent.estimate import capture_only
from tpu_agent.runtime.emulated import deferred
from tpu_agent.runtime.emulated.flush_cause import FlushCause
from tpu_agent.runtime.xla import graphs, tracing
capture_only.install()
traced = []
trace = tracing.trace
tracing.trace = lambda graph, plan, floats: traced.append(graph.hash) or trace(graph, plan, floats)
seen = []
graphs.graph_observers.append(lambda captured, inputs, precision: seen.append(
    (captured, [value for value in inputs if type(value) is float])))
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # bias corrections: new floats every step
updates = []
for step in range(4):
    model(torch.randn(8, 16, device="tpu")).square().mean().backward()
    deferred.flush(FlushCause.OPTIMIZER_STEP)  # the step's forward and backward graph
    del seen[:]
    optimizer.step()
    deferred.flush(FlushCause.OPTIMIZER_STEP)  # the update alone
    optimizer.zero_grad(set_to_none=True)
    updates.append(seen[-1])
recorded = len(traced)
updates[-1][0].gm  # read as the estimate reads the steady step's graphs
print(json.dumps({"graphs": [id(captured) for captured, _ in updates], "traced_while_running": recorded,
                  "traced": len(traced), "floats_differ": updates[2][1] != updates[1][1]}))
"""


def test_a_graph_is_traced_once_when_read_whatever_its_step_to_step_floats(tmp_path: Path) -> None:
    """AdamW's bias corrections are new Python floats at each step: the update of steps 1-3 is one graph, traced
    once, when the estimate reads it; the first step's update (it also creates the optimizer state) and the
    forward and backward graphs, never read, are never traced."""
    out = run_script(UPDATE_SCRIPT, tmp_path, TORCH_TPU_DEFER_AND_FUSE="1")
    assert out["floats_differ"], out  # the case under test: the same graph with other floats
    first, *steady = out["graphs"]
    assert len(set(steady)) == 1 and first not in steady, out
    assert (out["traced_while_running"], out["traced"]) == (0, 1), out
