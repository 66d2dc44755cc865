"""SH-4 on real programs compiled for v5e: a Linear(100, 300) step is padded by the compiler's tiles and the
finding points at the layer's definition; the same step with 128/384 has nothing to pad."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from compiled_helpers import compile_linear_step, line_of, linear_model

from tpu_agent.profile.model import Status
from tpu_agent.profile.rules import run_rules
from tpu_agent.profile.rules.sh_compiled_padding import PADDING_THRESHOLD, RULE, misaligned_dims


@pytest.fixture(scope="module")
def compiled(compile_cache: Path) -> dict[str, dict[str, Any]]:
    return {
        "odd": compile_linear_step("v5e", inputs=100, outputs=300, batch=8),
        "aligned": compile_linear_step("v5e", inputs=128, outputs=384, batch=8),
    }


def test_padded_dims_are_found_at_the_layer_definition(compiled: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    model, script = linear_model(tmp_path, compiled["odd"], inputs=100, outputs=300, batch=8)
    program = model.compiled.programs[0] if model.compiled else None
    assert program is not None and program.layout_padding_fraction >= PADDING_THRESHOLD
    assert {100, 300} <= set(misaligned_dims(program.top_matmuls, 128))
    findings, outcomes = run_rules(model)
    finding = next(f for f in findings if f.rule_id == "SH-4")
    assert (finding.locations[0].file, finding.locations[0].line) == (str(script), line_of(script, "# LAYER"))
    assert "torch.nn.Linear(100, 300)" in finding.locations[0].code
    assert "100->128, 300->384) in 'model' (Linear 300x100)" in finding.suggestion
    assert "dims 8 come from the data" in finding.suggestion
    assert finding.evidence.value == pytest.approx(program.layout_padding_fraction, abs=1e-4)
    assert next(o for o in outcomes if o.rule_id == "SH-4").status is Status.finding


def test_tile_multiples_leave_nothing_to_pad(compiled: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    model, _ = linear_model(tmp_path, compiled["aligned"], inputs=128, outputs=384, batch=8)
    assert RULE.check(model) == []
