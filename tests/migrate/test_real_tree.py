"""A small sample of the real-shaped tree (benchmarks/real_tree.py): the migrated tree parses, migrates to
itself, and, with the default options, converts at least 95% of the CUDA references that have a TorchTPU /
torch.accelerator form. Unsafe rewrites count as a form: held back by the default options, they count
against the share; with --unsafe-fixes none is held back."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tpu_agent.migrate import api
from tpu_agent.migrate.model import MigrateOptions, Target

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from breadth_tree import breadth_share, make_breadth_tree  # noqa: E402
from real_tree import conversion_share, make_tree  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("target", [Target.ACCELERATOR, Target.TPU], ids=["accelerator", "tpu"])
def test_real_shaped_sample_converts_what_has_a_tpu_form(tmp_path: Path, target: Target) -> None:
    root = make_tree(tmp_path / "tree", files=60, mean_lines=150, seed=13)
    options = MigrateOptions(target=target, jobs=1)
    plan = api.plan([root], options)
    share = conversion_share(plan)
    assert share.references > 100
    assert share.share >= 0.95, share
    unsafe = conversion_share(api.plan([root], MigrateOptions(target=target, unsafe_fixes=True, jobs=1)))
    assert unsafe.held_back == 0 and unsafe.converted == share.converted + share.held_back, (share, unsafe)
    api.apply(plan, allow_dirty=True)
    for path in root.rglob("*.py"):
        ast.parse(path.read_text(encoding="utf-8"))
    again = api.plan([root], options)
    assert not again.changed_files, [f.display_path for f in again.changed_files]


@pytest.mark.slow
@pytest.mark.parametrize("target", [Target.ACCELERATOR, Target.TPU], ids=["accelerator", "tpu"])
def test_breadth_sample_converts_every_kind_without_internal_errors(tmp_path: Path, target: Target) -> None:
    """One file of each kind of public training repository (benchmarks/breadth_tree.py): no file skipped, no
    edit dropped by an internal error, no CUDA reference left without a finding, >= 95% converted."""
    root = make_breadth_tree(tmp_path / "tree", copies=1, filler_lines=20)
    plan = api.plan([root], MigrateOptions(target=target, jobs=1))
    assert not [f.skipped_reason for f in plan.files if f.skipped_reason]
    share = breadth_share(plan)
    assert share.skipped_internal == 0 and share.internal_findings == 0
    assert share.silent.references == 0, share
    assert share.share >= 0.95, share
    api.apply(plan, allow_dirty=True)
    assert not api.plan([root], MigrateOptions(target=target, jobs=1)).changed_files
