"""What the capture says when it cannot give a whole step: a script that raised (its exception and line), a graph
of the step that no XLA program holds (no verdict unless --allow-partial, and then the share of the step's ops),
and the host-memory bound that switches a run to capture-only before the model outgrows the host. In process:
the watcher, the bound and the report are driven with real torch modules and FX graphs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tpu_agent.estimate import host_bound
from tpu_agent.estimate.capture import CaptureComplete, ObservedGraph, _finish, _Step, _Watcher, script_error
from tpu_agent.estimate.captured import CapturedGraph
from tpu_agent.estimate.layout import RESULT_FILE
from tpu_agent.estimate.report import summary_rows


def _raise_from(tmp_path: Path) -> BaseException:
    """A ValueError raised at line 3 of a user script (a real file, so the traceback names it)."""
    script = tmp_path / "train.py"
    script.write_text("def main():\n    batch = 3\n    raise ValueError(f'batch {batch} is odd')\n")
    namespace: dict[str, Any] = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    try:
        namespace["main"]()
    except ValueError as error:
        return error
    raise AssertionError("main() did not raise")


def test_a_script_that_raised_is_reported_with_its_exception_and_line(tmp_path: Path) -> None:
    """It was reported as 'nothing-captured ... make sure it moves its model to the tpu device'."""
    error = script_error(_raise_from(tmp_path), steps=1)
    assert error is not None and error.code == "script-raised"
    assert error.message == (
        f"{tmp_path / 'train.py'}:3: the script raised ValueError: batch 3 is odd (after 1 optimizer step(s))"
    )
    assert "capture-only" not in error.hint
    without_values = script_error(_raise_from(tmp_path), steps=1, capture_only=True)
    assert without_values is not None and "failed only without values (capture-only)" in without_values.hint
    assert script_error(SystemExit(0), steps=3) is None  # the capture's own stop, or a script that ended
    assert script_error(None, steps=3) is None
    cleanup = RuntimeError("the script's finally: failed while the complete capture unwound it")
    cleanup.__context__ = CaptureComplete()
    assert script_error(cleanup, steps=3) is None  # the step was captured: the estimate stands


class _Runner:
    """What the watcher reads of a graph runner: its name and FX graph."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gm = make_fx(lambda x: (x * 2).sin())(torch.ones(2))


def _step_with_a_missing_graph() -> _Watcher:
    watcher = _Watcher(steps=3)
    step = _Step(flushed=[("deferred graph aaa", 300), ("deferred graph bbb", 100)])
    step.graphs[("aaa", None)] = ObservedGraph(_Runner("deferred graph aaa"), None, [])
    watcher.steady = step
    watcher.fallbacks["deferred graph bbb"] = (100, "NotPlannable: views of one storage in two dtypes")
    return watcher


def test_coverage_counts_the_steps_ops_and_names_what_no_program_holds() -> None:
    watcher = _step_with_a_missing_graph()
    coverage = watcher.coverage(watcher.step_seen())
    assert (coverage.ops_compiled, coverage.ops, coverage.share) == (300, 400, 0.75)
    assert coverage.missing == ["deferred graph bbb (100 ops): NotPlannable: views of one storage in two dtypes"]


def test_a_step_with_a_graph_left_out_gets_no_verdict_without_allow_partial(tmp_path: Path) -> None:
    """The published Llama3.1-8B shapes got a verdict, 0.53 s and 12 % MFU from a step whose forward and
    backward graph was left out (NotPlannable), 6.5x faster than measured."""
    options = {"target": "v5e", "strategy": "as-captured", "capture_only": True}
    _finish(_step_with_a_missing_graph(), tmp_path, options, lambda: None)
    error = json.loads((tmp_path / RESULT_FILE).read_text())["error"]
    assert error["code"] == "partial-step" and error["exit_code"] == 1
    assert "25% of its 400 ops: deferred graph bbb (100 ops): NotPlannable" in error["message"]
    assert "so none is given" in error["message"] and "--allow-partial" in error["hint"]


def test_a_partial_estimate_marks_every_figure_with_its_share() -> None:
    data = {
        "target": "v5e", "chips": 1, "chip": "TPU v5e", "strategy": "as-captured", "verdict": "fits",
        "peak_hbm_bytes_per_chip": 1 << 20, "hbm_bytes_per_chip": 16 << 30, "flops_per_chip_per_step": 1e9,
        "step_seconds": 0.001, "mfu": 0.2, "programs": [], "compiler": "libtpu", "step_ops_share": 0.75,
        "largest_memory": [],
    }  # fmt: skip
    rows = dict(summary_rows(data))
    for figure in (
        "verdict",
        "peak HBM per chip",
        "FLOPs per chip per step",
        "step time (compiler's optimal, uncalibrated)",
        "MFU at that time",
    ):
        assert rows[figure].endswith("(PARTIAL: 75% of the step's ops)"), rows
    assert "PARTIAL" not in dict(summary_rows({**data, "step_ops_share": 1.0}))["verdict"]


@pytest.fixture
def bound_hook() -> Any:
    """A HostBound watching parameter registration (torch's global hook), removed after the test."""
    switched: list[bool] = []
    bound = host_bound.HostBound(bound=4 * 1024 * 1024, switch=lambda: switched.append(True))
    handle = torch.nn.modules.module.register_module_parameter_registration_hook(bound.parameter_registered)
    yield bound, switched
    handle.remove()


def test_the_bound_switches_once_the_parameters_training_needs_pass_it(bound_hook: Any) -> None:
    """A 0.7B GPT was run for real, grew to 21 GB of a 24 GB host and was killed: the switch must come while
    the model is built, from its parameters' bytes x4 (weights, gradients, two AdamW moments)."""
    bound, switched = bound_hook
    torch.nn.Linear(256, 256, bias=False)  # 256 KiB x4 = 1 MiB: under the 4 MiB bound
    assert bound.chosen is None and not switched
    tied = torch.nn.Linear(256, 256, bias=False)
    tied.weight = tied.weight  # registered again (a tied head), held once: counted once
    assert bound.parameter_bytes == 2 * 256 * 256 * 4 and not switched
    torch.nn.Linear(256, 256, bias=False)  # 768 KiB x4 = 3 MiB: still under the bound
    assert not switched
    torch.nn.Linear(256, 512, bias=False)  # 512 KiB more: 1.25 MiB x4 = 5 MiB, past it
    assert switched == [True]
    assert bound.chosen is not None and "parameters reached 1.25 MiB at " in bound.chosen
    assert "training them needs about 4x that (5.00 MiB" in bound.chosen and "test_capture_reports.py:" in bound.chosen
    assert "past the host-memory bound of 4.00 MiB (--host-memory)" in bound.chosen
    torch.nn.Linear(512, 512)  # switched once, for good
    assert switched == [True]


def test_the_default_bound_is_a_quarter_of_the_hosts_ram() -> None:
    assert host_bound.default_bound_bytes() == pytest.approx(host_bound.host_ram_bytes() / 4, rel=1e-6)
    assert 0 < host_bound.resident_bytes() < host_bound.host_ram_bytes()


def test_under_capture_only_new_parameters_have_no_data_and_ties_stay_ties() -> None:
    """A model built on the host the usual way (``GPT(config).to(device)``) allocated its weights before
    capture-only could see them; a weight tied to one made before the switch must stay tied."""
    from tpu_agent.estimate import capture_only
    from tpu_agent.runtime.emulated import placement

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(capture_only.swap_parameter)
    try:
        embedding = torch.nn.Embedding(64, 8)  # before the switch: real data
        with placement.placed_on(torch.device("meta")):
            head = torch.nn.Linear(8, 64, bias=False)
            assert head.weight.is_meta and head.weight.shape == (64, 8) and head.weight.requires_grad
            head.weight = embedding.weight
            assert head.weight is embedding.weight and not embedding.weight.is_meta
    finally:
        handle.remove()


def test_fsdp2_gradient_staging_that_does_not_compile_leaves_nothing_of_the_step_out() -> None:
    """FSDP2's fsdp::chunk_cat (its reduce-scatter staging) cannot be functionalised; the compiled step reduces
    gradients itself, so llama_fsdp_train.py must still get a verdict."""
    watcher = _step_with_a_missing_graph()
    watcher.steady.staging.add("deferred graph bbb")  # type: ignore[union-attr]
    coverage = watcher.coverage(watcher.step_seen())
    assert (coverage.ops_compiled, coverage.ops, coverage.missing) == (300, 300, [])


def test_a_graph_that_cannot_be_traced_when_read_is_left_out_and_named() -> None:
    """Capture-only traces a graph when the estimate reads it: one with an op XLA cannot lower is then left out
    of the step's programs and named with the reason, as a graph that fell back while running is."""
    watcher = _Watcher(steps=3)
    step = _Step(flushed=[("deferred graph aaa", 300), ("deferred graph ccc", 50)])
    step.graphs[("aaa", None)] = ObservedGraph(_Runner("deferred graph aaa"), None, [])

    def no_lowering() -> torch.fx.GraphModule:
        raise NotImplementedError("no XLA lowering for aten._fft_r2c.default")

    untraceable = CapturedGraph("deferred graph ccc", None, "ccc", 50, no_lowering)
    step.graphs[("ccc", None)] = ObservedGraph(untraceable, None, [])
    watcher.steady = step
    watcher.trace_graphs(step)
    coverage = watcher.coverage(step)
    assert [str(seen.runner.name) for seen in watcher.whole_graphs(step)] == ["deferred graph aaa"]
    assert coverage.missing == [
        "deferred graph ccc (50 ops): NotImplementedError: no XLA lowering for aten._fft_r2c.default"
    ]
