"""benchmarks/hf_coverage.py on a one-architecture selection: it runs check and writes the coverage page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
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
