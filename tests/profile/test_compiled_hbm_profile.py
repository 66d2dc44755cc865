"""SD-3 on real programs compiled for v5e: a step whose fp32 weight alone is 24 GiB is refused by the TPU
compiler (does not fit one chip), and the fix offered is the one that compiled into a fitting step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from compiled_helpers import document, line_of, linear_model, sgd_step

from tpu_agent.chips import GIB, parse_target
from tpu_agent.errors import TpuAgentError
from tpu_agent.profile.api import diagnose
from tpu_agent.profile.compiled import compiled_step
from tpu_agent.profile.layout import COMPILED_FILE, raw_dir
from tpu_agent.profile.rules.sd_compiled_hbm import RULE
from tpu_agent.profile.synthetic import write_capture

INPUTS, OUTPUTS, BATCH = 65536, 98304, 8  # 24 GiB of fp32 weights against 16 GiB of HBM; 12 GiB in bf16


@pytest.fixture(scope="module")
def too_big(compile_cache: Path) -> dict[str, Any]:
    """The step compiled for one v5e chip, with the fixes `tpu-agent estimate` checks (one: bf16 state)."""
    import jax
    import jax.numpy as jnp

    from tpu_agent.estimate import ArgRole, ArgSpec, StepProgram, estimate_step, suggest_fixes

    program = StepProgram(
        "train_step",
        sgd_step(jnp, jax),
        (
            ArgSpec("weight", (OUTPUTS, INPUTS), "float32", ArgRole.PARAMETER),
            ArgSpec("batch", (BATCH, INPUTS), "float32", ArgRole.BATCH, shard_dim=0),
        ),
        donated=(0,),
    )
    target = parse_target("v5e")
    estimate = estimate_step([program], target)
    estimate.suggestions = suggest_fixes([program], target, "as-captured", max_compiles=1)
    return document(estimate.to_dict())


def test_compiler_verdict_and_a_compiled_fix(too_big: dict[str, Any], tmp_path: Path) -> None:
    model, script = linear_model(tmp_path, too_big, inputs=INPUTS, outputs=OUTPUTS, batch=BATCH)
    assert model.compiled is not None and not model.compiled.fits
    assert model.compiled.peak_hbm_bytes > 16 * GIB
    (finding,) = RULE.check(model)
    assert finding.severity.value == "error"
    assert finding.evidence.value > 1.0
    assert [(loc.file, loc.line) for loc in finding.locations] == [
        (str(script), line_of(script, "# FORWARD")),
        (str(script), line_of(script, "# LAYER")),
    ]
    assert "bf16 (v5e): fits" in finding.suggestion
    assert finding.agent_change is not None and "bfloat16" in finding.agent_change.description


def test_a_step_that_fits_has_no_finding(too_big: dict[str, Any], tmp_path: Path) -> None:
    fitting = compiled_step(too_big)
    fitting.fits, fitting.peak_hbm_bytes = True, GIB
    model, _ = linear_model(tmp_path, fitting, inputs=INPUTS, outputs=OUTPUTS, batch=BATCH)
    assert RULE.check(model) == []


def test_diagnose_reads_the_compiled_step_kept_with_the_capture(too_big: dict[str, Any], tmp_path: Path) -> None:
    """`profile` keeps the compiler's estimate in the raw directory; `diagnose` of the logdir weighs it again."""
    write_capture(tmp_path, steps=6)
    (raw_dir(tmp_path) / COMPILED_FILE).write_text(json.dumps(too_big), encoding="utf-8")
    diagnosis = diagnose(tmp_path)
    assert "SD-3" in {f.rule_id for f in diagnosis.findings}
    assert diagnosis.estimate.method == "tpu-compiler"
    assert diagnosis.estimate.compiler == too_big["estimate"]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("estimate", "programs"), "many"),
        (("estimate", "target"), "v99x"),
        (("estimate", "chips"), 0),
        (("estimate", "mfu"), "high"),
        (("estimate", "verdict"), "<script>"),
    ],
)
def test_a_crafted_compiled_step_is_refused_naming_the_file(
    too_big: dict[str, Any], tmp_path: Path, path: tuple[str, str], value: object
) -> None:
    write_capture(tmp_path, steps=6)
    crafted = json.loads(json.dumps(too_big))
    crafted[path[0]][path[1]] = value
    (raw_dir(tmp_path) / COMPILED_FILE).write_text(json.dumps(crafted), encoding="utf-8")
    with pytest.raises(TpuAgentError) as error:
        diagnose(tmp_path)
    assert COMPILED_FILE in error.value.message
