"""Constants followed across the modules of the migrated tree (``from settings import ACCEL`` / ``settings.ACCEL``).

Each case in ``fixtures/crossmodule/<case>/in`` is migrated as a tree for both targets and compared with
``fixtures/crossmodule/<case>/<target>/`` (the migrated Python files) and ``<target>.findings.json`` (path, line, code,
fixed). Regenerate with ``TPU_AGENT_REGEN_FIXTURES=1``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REGEN

from tpu_agent.migrate.analysis.crossmodule import PythonFile, imported_uses
from tpu_agent.migrate.analysis.valueflow import Verdict
from tpu_agent.migrate.engine import build_plan
from tpu_agent.migrate.model import MigrateOptions, Target

CASES = Path(__file__).parent / "fixtures" / "crossmodule"
TARGETS = [Target.ACCELERATOR, Target.TPU]


def _case_ids() -> list[str]:
    return sorted(p.name for p in CASES.iterdir() if (p / "in").is_dir())


@pytest.mark.parametrize("target", TARGETS, ids=[t.value for t in TARGETS])
@pytest.mark.parametrize("case", _case_ids())
def test_case(case: str, target: Target, tmp_path: Path) -> None:
    tree = tmp_path / case
    shutil.copytree(CASES / case / "in", tree)
    plan = build_plan([tree], MigrateOptions(target=target, jobs=1))
    outputs = {
        str(f.path.relative_to(tree)): f.migrated_bytes.decode() for f in plan.files if f.migrated_bytes is not None
    }
    findings = [
        [str(result.path.relative_to(tree)), f.line, f.code, f.fixed] for result in plan.files for f in result.findings
    ]
    expected_dir = CASES / case / target.value
    expected_findings = CASES / case / f"{target.value}.findings.json"
    if REGEN:
        shutil.rmtree(expected_dir, ignore_errors=True)
        for name, text in outputs.items():
            (expected_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (expected_dir / name).write_text(text, encoding="utf-8")
        expected_findings.write_text(json.dumps(findings) + "\n")
    expected = {str(p.relative_to(expected_dir)): p.read_text(encoding="utf-8") for p in expected_dir.rglob("*.py")}
    assert outputs == expected
    assert findings == json.loads(expected_findings.read_text())


def test_imports_are_resolved_by_module_path(tmp_path: Path) -> None:
    """A constant reaches only the modules that import *its* module: a same-named module elsewhere does not count,
    and ``from pkg import config`` / relative imports resolve against the directories."""
    files = {
        "a/config.py": 'ACCEL = "cuda"\n',
        "b/config.py": 'ACCEL = "cuda"\n',
        "a/use.py": "from .config import ACCEL\nimport torch\ntorch.ones(1).to(ACCEL)\n",
        "b/use.py": "from b import config\nKEYS = {config.ACCEL: 1}\n",
    }
    parsed = [PythonFile(tmp_path / name, name, text.encode()) for name, text in files.items()]
    found = imported_uses(parsed)
    a_flows = found[tmp_path / "a/config.py"]["name:ACCEL"]
    b_flows = found[tmp_path / "b/config.py"]["name:ACCEL"]
    assert [(f.display, f.flow.verdict) for f in a_flows] == [("a/use.py", Verdict.DEVICE)]
    assert [(f.display, f.flow.other_lines) for f in b_flows] == [("b/use.py", (2,))]


def test_pool_hands_defining_files_the_scan_they_wait_for(tmp_path: Path) -> None:
    """With a process pool, files that define no constant start before the cross-module scan is done and the
    defining files follow with its result: the plan must be the one-worker plan, file for file."""
    case = _case_ids()[0]
    tree = tmp_path / case
    shutil.copytree(CASES / case / "in", tree)
    for index in range(3):  # enough parse work (POOL_MIN_BYTES) for the engine to start a pool
        (tree / f"filler_{index}.py").write_text("# cuda\n" * 15_000, encoding="utf-8")
    plans = [build_plan([tree], MigrateOptions(jobs=jobs)) for jobs in (1, 2)]
    summaries = [[(f.path, f.migrated_bytes, f.findings, f.skipped_reason) for f in plan.files] for plan in plans]
    assert summaries[0] == summaries[1]
    assert any(f.migrated_bytes is not None for f in plans[1].files if not f.path.name.startswith("filler"))
