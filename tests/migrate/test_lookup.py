"""``tpu_lookup_api`` answers from the rule records, so the lookup and ``tpu-agent migrate`` agree.

The cases that used to disagree (a hand-written table said the RNG state moved to ``torch.accelerator.random``
and that memory statistics were unverified) are checked against what the engine really does to the same code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_agent.errors import TpuAgentError
from tpu_agent.migrate import api
from tpu_agent.migrate.model import MigrateOptions, Safety
from tpu_agent.migrate.rules import ALL_RULES
from tpu_agent.plugins.api_lookup import EMULATED, STATUSES, load_table, lookup


def _migrate(tmp_path: Path, line: str) -> tuple[str, list[tuple[str, bool]]]:
    source = tmp_path / "snippet.py"
    source.write_text(f"import torch\n{line}\n")
    result = api.plan([source], MigrateOptions(jobs=1)).files[0]
    text = (result.migrated_bytes or source.read_bytes()).decode()
    return text, [(f.code, f.fixed) for f in result.findings]


def test_every_rule_answers_and_every_row_comes_from_a_rule_or_the_torch_tpu_surface() -> None:
    legend, rows = load_table()
    surface = [row for row in rows if row.status == EMULATED[0]]  # tests/runtime/test_torch_tpu_surface.py
    prefixes = ("torch_tpu.", "torch.tpu.", "torch.backends.tpu.")  # the face, and the modules the backend installs
    assert surface and all(row.tpu.startswith(prefixes) and not row.rule for row in surface)
    rows = tuple(row for row in rows if row not in surface)
    assert {row.rule for row in rows} == set(ALL_RULES)
    for row in rows:
        rule = ALL_RULES[row.rule]
        assert row.status == STATUSES[rule.safety][0] and row.status in legend
        assert row.reference == rule.reference and row.since_torch == rule.since_torch
        assert row.cuda and row.tpu and row.keywords


def test_rng_state_is_manual_in_both(tmp_path: Path) -> None:
    match = lookup("torch.cuda.get_rng_state")[0]
    assert match.cuda == "torch.cuda.get_rng_state()" and match.status == "manual"
    assert "torch.get_device_module(DEVICE).get_rng_state()" in match.tpu
    assert "newer than 2.13" in match.tpu  # not a torch.accelerator.random rewrite on the torch this targets
    text, findings = _migrate(tmp_path, "state = torch.cuda.get_rng_state()")
    assert findings == [(match.rule, False)] and "torch.cuda.get_rng_state()" in text  # reported, not rewritten


def test_memory_stats_are_a_safe_rewrite_in_both(tmp_path: Path) -> None:
    match = lookup("max_memory_allocated")[0]
    assert match.cuda == "torch.cuda.max_memory_allocated()" and match.tpu == "torch.accelerator.max_memory_allocated()"
    assert match.status == "rewrite" and match.since_torch == ALL_RULES[match.rule].since_torch == "2.10"
    assert "unverified" not in match.note
    text, findings = _migrate(tmp_path, "peak = torch.cuda.max_memory_allocated()")
    assert findings == [(match.rule, True)] and "torch.accelerator.max_memory_allocated()" in text


@pytest.mark.parametrize(
    ("query", "written"),
    [
        ("torch.cuda.synchronize()", "torch.accelerator.synchronize()"),
        ("torch.cuda.memory_reserved()", "torch.accelerator.memory_reserved()"),
        ("torch.cuda.current_device()", "torch.accelerator.current_device_index()"),
        ("torch.cuda.OutOfMemoryError", "torch.OutOfMemoryError"),
    ],
)
def test_renames_the_lookup_promises_are_what_migrate_writes(tmp_path: Path, query: str, written: str) -> None:
    match = lookup(query)[0]
    assert match.cuda == query and match.tpu == written and match.status == "rewrite"
    text, findings = _migrate(tmp_path, f"value = {query}")
    assert (match.rule, True) in findings and written in text


def test_statuses_follow_the_rule_safety() -> None:
    assert lookup("cudnn.deterministic")[0].status == "unsafe-rewrite" == STATUSES[Safety.UNSAFE][0]
    assert lookup("GradScaler")[0].status == "rewrite" == STATUSES[Safety.SAFE][0]
    assert lookup("flash_attn")[0].status == "manual"
    assert lookup("CUDA_VISIBLE_DEVICES")[0].tpu == "TPU_VISIBLE_DEVICES"


def test_unknown_and_empty_queries_are_errors() -> None:
    with pytest.raises(TpuAgentError) as error:
        lookup("zzzqqq")
    assert error.value.code == "unknown-api"
    with pytest.raises(TpuAgentError) as error:
        lookup("  ")
    assert error.value.code == "empty-query"
