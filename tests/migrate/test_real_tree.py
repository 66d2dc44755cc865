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
