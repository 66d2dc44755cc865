"""Which results of a pending DeferAndFuse graph the program can still read (``liveness.live_results``), asked of
real recorded graphs in a fresh process: variables, autograd's saved tensors, views and their bases, containers,
and a node's argument tuple held from outside all keep results live; everything else is an intermediate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_launch_util import clean_env

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json
import torch
from tpu_agent.runtime.api import activate
activate()
from tpu_agent.runtime.emulated import deferred, liveness

def live_ids():
    graph = deferred._pending
    return liveness.live_results(graph, liveness.Walk(graph))

out = {}
x = torch.randn(4, 6).to("tpu")
w = torch.randn(6, 6).to("tpu").requires_grad_()
x.sum().item()  # the uploads are materialised: the graphs below start empty

kept = (x @ w).relu() * 2       # mm and relu are saved by autograd (C++ references); the product is kept
dropped = (kept + 1).exp().sum() # the add and exp are intermediates; the sum is kept
del dropped
view = (x * 3).t()               # a view kept, its base only reachable through it
pieces = (x + 5).split(3, dim=1) # split's outputs: the program keeps one of them
first = pieces[0]
del pieces
sized = (x - 1).view(2, 12)      # a view op with a size list
live = live_ids()
nodes = deferred._pending.nodes
by_name = {}
for node in nodes:
    for t in liveness.tensors_in(node.outputs):
        by_name.setdefault(str(node.func), []).append(id(t) in live)
out["by_op"] = by_name
out["kept"] = id(kept) in live and id(view) in live and id(first) in live and id(sized) in live
walk = liveness.Walk(deferred._pending)
out["views"] = [str(node.func) for node in walk.views]
out["fingerprint"] = walk.fingerprint is not None
del walk, nodes
kept.sum().item()

# a node's argument tuple held from outside its node: every tensor in it stays live
a = (x + 1) * 2
b = a + 3
del a
a_id = id(deferred._pending.nodes[-1].args[0])
held = deferred._pending.nodes[-1].args
out["held_tuple"] = a_id in live_ids()
del held
out["released_tuple"] = a_id in live_ids()
b.sum().item()

# two recordings of the same step have equal fingerprints (a compiling executor recalls its plan by it)
def step():
    return ((x @ w).tanh() * 0.5).sum()
prints = []
for _ in range(2):
    s = step()
    prints.append(liveness.Walk(deferred._pending).fingerprint)
    s.item()
out["same_fingerprint"] = prints[0] is not None and prints[0] == prints[1]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_live_results_keep_what_the_program_can_read_and_drop_intermediates(tmp_path: Path) -> None:
    script = tmp_path / "liveness_cases.py"
    script.write_text(SCRIPT)
    env = clean_env()
    env.update(PYTHONPATH=str(REPO), TORCH_TPU_DEFER_AND_FUSE="1", TPU_AGENT_BACKEND="emulated")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    by_op = out["by_op"]
    assert out["kept"], by_op
    # mm and relu: saved for backward (relu saves its result, mm its inputs); mul: the kept product
    assert by_op["aten.mm.default"] == [False] and by_op["aten.relu.default"] == [True], by_op
    # add and exp of the dropped branch are intermediates (exp saves its result for backward: live)
    assert by_op["aten.exp.default"] == [True] and by_op["aten.sum.default"] == [False], by_op
    # the kept view's base is live through it; of split's outputs only the kept one
    assert by_op["aten.t.default"] == [True] and by_op["aten.split.Tensor"] == [True, False], by_op
    # the walk lists the view nodes in graph order (autograd's detach of a saved result is one too)
    assert [v for v in out["views"] if v != "aten.detach.default"] == [
        "aten.t.default",
        "aten.split.Tensor",
        "aten.view.default",
    ]
    assert out["fingerprint"]
    assert out["held_tuple"] and not out["released_tuple"], out
    assert out["same_fingerprint"]
