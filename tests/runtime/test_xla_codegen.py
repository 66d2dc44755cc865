"""What the XLA path generates from a graph stays valid Python, and what it cannot compile it says: graphs with ops
named after Python keywords compile (``torch.randint(..., device=dev)`` records ``aten.random.from``), and a graph
that falls back to running op by op is named on stderr, once per reason."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import state
from tpu_agent.runtime.xla import fx_names, graphs


def test_keyword_op_names_become_getattr_and_other_names_stay() -> None:
    assert fx_names.python_expression("torch.ops.aten.random.from") == "getattr(torch.ops.aten.random, 'from')"
    assert fx_names.python_expression("torch.ops.aten.add.Tensor") == "torch.ops.aten.add.Tensor"


def test_a_graph_drawing_random_integers_traces_and_compiles_through_xla() -> None:
    """``aten.random.from`` (what DeferAndFuse records for ``torch.randint`` on the device) in a graph: FX wrote
    ``torch.ops.aten.random.from(...)`` into the generated code, a SyntaxError, and the toy GPT of issue 34 ran
    op by op (and could not be estimated)."""

    def draw(x: torch.Tensor) -> torch.Tensor:
        return getattr(torch.ops.aten.random, "from")(x, 3, 10) * 2

    gm = make_fx(draw)(torch.zeros(64))
    assert "getattr(torch.ops.aten.random, 'from')" in gm.code
    runner = graphs.GraphRunner(gm, "randint", precision=state.Precision.HIGHEST)
    values = runner(torch.zeros(64))
    assert not runner.compile_failed and runner.split is None
    assert values.shape == (64,) and bool(((values >= 6) & (values < 20)).all())


def test_a_fallback_is_said_on_stderr_once_per_reason(capsys: pytest.CaptureFixture[str]) -> None:
    site = events.Site("train.py", 12, "main")
    for name in ("deferred graph aaa", "deferred graph bbb"):
        graphs.report_fallback(name, 283, NotImplementedError("no lowering for aten.frobnicate"), site)
    graphs.report_fallback("deferred graph ccc", 7, ValueError("another reason"), None)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "tpu-agent: --compiler xla: deferred graph aaa (283 ops) (recorded at train.py:12) runs op by op on the "
        "CPU, not through XLA: NotImplementedError: no lowering for aten.frobnicate",
        "tpu-agent: --compiler xla: deferred graph ccc (7 ops) runs op by op on the CPU, not through XLA: "
        "ValueError: another reason",
    ]
