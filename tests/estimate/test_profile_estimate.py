"""profile's TPU estimate: the roofline says it is one (and how to get the compiler's), and the TPU compiler's
own estimate is reported beside it when it ran."""

from __future__ import annotations

import json

import pytest
from test_estimate_cli import MLP, run_cli
from tpu_compiler import needs_tpu_compiler

from tpu_agent.estimate.compiler import compiler_status
from tpu_agent.estimate.hlo import summarize
from tpu_agent.estimate.model import CompiledEstimate, HbmBreakdown, ProgramEstimate
from tpu_agent.profile.estimate import attach_compiler_estimate, roofline_label
from tpu_agent.profile.model import Estimate as ProfileEstimate
from tpu_agent.profile.report._common import estimate_lines


def test_roofline_is_labelled_with_what_is_missing_for_the_compilers_estimate() -> None:
    label = roofline_label()
    assert label.startswith("roofline from the captured ops")
    if compiler_status().available:
        assert "--tpu-compiler" in label  # the compiler pass is opt-in: the label says how to ask for it
    else:
        assert "not the TPU compiler" in label and 'pip install "tpu-agent[estimate]"' in label


def test_compiler_estimate_is_shown_beside_the_roofline() -> None:
    memory = HbmBreakdown(100, 200, 0, 10, 50, 1000, 30)
    program = ProgramEstimate("0: deferred graph", 2e9, 1e8, 0.0, 0.004, memory, summarize(""))
    compiled = CompiledEstimate("v5e-4", "TPU v5e", 4, "data-parallel", "fast", 16 * 1024**3, 197e12, [program])
    roofline = ProfileEstimate(chip="v5e", available=True, flops_per_step=1e9, bytes_per_step=1e6, eager_step_s=0.01)
    attach_compiler_estimate(roofline, {"estimate": compiled.to_dict()})
    lines = estimate_lines(roofline.to_dict())
    assert roofline.method == "tpu-compiler"
    assert lines[0].startswith("TPU compiler (libtpu) on v5e-4, data-parallel: fits") and "4.000 ms" in lines[0]
    assert lines[1].startswith("Roofline on v5e")
    missing = ProfileEstimate(chip="v5e", available=True)
    attach_compiler_estimate(missing, None, "the script ran no graph through the XLA compiler")
    assert missing.method == "roofline" and missing.assumptions[-1].startswith("no TPU compiler estimate: ")


@needs_tpu_compiler
@pytest.mark.slow
def test_profile_reports_the_compilers_estimate_when_libtpu_is_here(tmp_path) -> None:  # noqa: ANN001
    result = run_cli("profile", "--tpu-compiler", "--chip", "v5e-4", "--steps", "2", "--warmup", "1", "--logdir", str(tmp_path),
                     "--format", "json", str(MLP), "--steps", "6")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    estimate = json.loads(result.stdout)["estimate"]
    assert estimate["method"] == "tpu-compiler" and estimate["compiler"]["target"] == "v5e-4"
    assert estimate["compiler"]["verdict"] == "fits"
