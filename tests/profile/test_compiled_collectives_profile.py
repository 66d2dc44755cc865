"""SD-4 on real programs compiled for a v5e-4 slice (data parallel): a 2-row-per-chip step spends most of its
time in the gradients' all-reduce; with 4096 rows per chip the computation hides it (at 1024 the compiler's least
effort, the estimate's default, leaves the all-reduce at a third of the step)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from compiled_helpers import compile_linear_step, line_of, linear_model

from tpu_agent.profile.rules.sd_collective_bound import SHARE_THRESHOLD
from tpu_agent.profile.rules.sd_compiled_collectives import RULE, step_split

HIDDEN = 512


@pytest.fixture(scope="module")
def compiled(compile_cache: Path) -> dict[str, dict[str, Any]]:
    return {
        batch: compile_linear_step("v5e-4", inputs=HIDDEN, outputs=HIDDEN, batch=batch, strategy="data-parallel")
        for batch in (8, 16384)
    }


def test_small_per_chip_batch_is_collective_bound(compiled: dict[int, dict[str, Any]], tmp_path: Path) -> None:
    model, script = linear_model(tmp_path, compiled[8], inputs=HIDDEN, outputs=HIDDEN, batch=8)
    assert model.compiled is not None
    collective_s, compute_s, kinds = step_split(model.compiled)
    # the fp32 gradient of the replicated 512x512 weight is all-reduced across the 4 chips
    assert kinds["all-reduce"][1] >= HIDDEN * HIDDEN * 4
    (finding,) = RULE.check(model)
    assert finding.evidence.value == pytest.approx(collective_s / (collective_s + compute_s), abs=1e-3)
    assert finding.evidence.value >= SHARE_THRESHOLD
    assert (finding.locations[0].file, finding.locations[0].line) == (str(script), line_of(script, "# FORWARD"))
    assert "all-reduce" in finding.title and "v5e-4" in finding.title
    assert finding.agent_change is not None and "no_sync" in finding.agent_change.description


def test_large_per_chip_batch_hides_the_all_reduce(compiled: dict[int, dict[str, Any]], tmp_path: Path) -> None:
    model, _ = linear_model(tmp_path, compiled[16384], inputs=HIDDEN, outputs=HIDDEN, batch=16384)
    assert model.compiled is not None
    collective_s, compute_s, _ = step_split(model.compiled)
    assert 0 < collective_s < compute_s
    assert RULE.check(model) == []
