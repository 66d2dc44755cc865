"""benchmarks/hf_coverage.py on a one-architecture selection: it runs check and writes the coverage page."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.long  # the sweep's process and its check worker, both importing transformers
def test_coverage_sweep_writes_the_markdown_table(tmp_path: Path) -> None:
    output, raw = tmp_path / "coverage.md", tmp_path / "coverage.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "benchmarks" / "hf_coverage.py"), "--only", "vit", "--modes", "strict"]
    result = subprocess.run(
        [*command, "--jobs", "1", "--output", str(output), "--json", str(raw)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "strict: 1/1 pass (100.0%)" in result.stdout
    page = output.read_text(encoding="utf-8")
    assert "| strict | 1 | 1 | 0 | 0 | 0 | 100.0% | >= 98% |" in page
    assert "| image-classification | strict | 1 | 0 | 0 | 100.0% |" in page
    [report] = json.loads(raw.read_text(encoding="utf-8"))
    assert report["case"] == {
        "model_type": "vit",
        "task": "image-classification",
        "class_name": "ViTForImageClassification",
    }


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("hf_coverage", ROOT / "benchmarks" / "hf_coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _result(class_name: str, **verdicts: str) -> dict[str, Any]:
    modes = []
    for mode, status in verdicts.items():
        error = {"stage": "tpu-forward", "type": "RuntimeError", "message": "boom 42", "location": "m.py:3 in f"}
        modes.append({"mode": mode.replace("_", "-"), "status": status, "error": error if status == "error" else None})
    return {"case": {"model_type": class_name.lower(), "task": "causal-lm", "class_name": class_name}, "modes": modes}


def _page_meta() -> dict[str, Any]:
    """The run facts a page header needs, for a two-architecture sweep."""
    return {
        "date": "d",
        "transformers": "t",
        "torch": "p",
        "selected": 2,
        "available": 2,
        "subset_note": "",
        "note": "",
    }


def test_merged_runs_make_one_page_with_sampled_modes_marked() -> None:
    bench = _bench()
    eager = [
        _result("AModel", strict="pass", defer_and_fuse="pass"),
        _result("BModel", strict="pass", defer_and_fuse="error"),
    ]
    compiled = [_result("BModel", compile="pass")]
    eager[1]["confirmed_in_isolation"] = True
    rerun = [_result("AModel", defer_and_fuse="pass")]  # a later run's verdict replaces the earlier one
    merged = bench.merge_results([eager, compiled, rerun])
    assert [[m["mode"] for m in r["modes"]] for r in merged] == [
        ["strict", "defer-and-fuse"],
        ["strict", "defer-and-fuse", "compile"],
    ]
    meta = _page_meta()
    page = bench.render_markdown(merged, ("strict", "defer-and-fuse", "compile"), meta)
    assert "| defer-and-fuse | 2 | 1 | 0 | 1 | 0 | 50.0% | >= 98% |" in page
    assert "| compile | 1 | 1 | 0 | 0 | 0 | 100.0% |  |" in page
    assert "| BModel | bmodel | causal-lm | pass | error | pass | RuntimeError: boom N at m.py:3 in f |" in page
    assert "(1 re-checked, 0 of them passed in fresh processes)" in page
    assert "compile: checked on a sample only" in page


def test_compile_sample_is_the_same_for_any_selection_and_runs_are_listed_to_reproduce() -> None:
    bench = _bench()
    every = [bench.Case(f"t{i}", "causal-lm", f"C{i}") for i in range(9)]
    assert bench.compile_sample(every, 4) == {"C0", "C4", "C8"}
    modes = ("strict", "defer-and-fuse", "compile")
    assert bench.case_modes(every[4], modes, {"C4"}) == modes
    assert bench.case_modes(every[5], modes, {"C4"}) == ("strict", "defer-and-fuse")
    run = bench.run_record(["--only", "llama", "--note", "two words"])
    assert run["command"] == "python benchmarks/hf_coverage.py --only llama --note 'two words'" and run["commit"]
    first, second = _result("AModel", strict="pass"), _result("BModel", strict="pass")
    first["runs"], second["runs"] = [{**run, "wall_s": 120}], [{**run, "wall_s": 120}]
    meta = _page_meta()
    page = bench.render_markdown([first, second], ("strict",), {**meta, "merge_command": "python m.py --merge a b"})
    assert f"    {run['command']}\n\nat {run['commit']} on {run['date']}: 2 architectures, 2 min wall" in page
    assert page.endswith("    python m.py --merge a b\n")
