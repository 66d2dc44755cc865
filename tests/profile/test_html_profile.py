"""The HTML report rendered by headless Chromium: one self-contained file that shows plots and findings."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from profile_helpers import Captures

pytestmark = pytest.mark.slow  # every test here launches `tpu-agent` (and torch) in a subprocess

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium is not installed (apt-get install -y chromium); the HTML report was not rendered")


def test_html_report_renders_plots_and_findings(captures: Captures, tmp_path: Path) -> None:
    browser = _chromium()
    logdir, report, _ = captures.get("fp32_odd_dims.py")
    page = logdir / "tpu-agent" / "report.html"
    source = page.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", source), (
        "the report must not load anything from the network"
    )
    assert "<script" not in source

    dom = subprocess.run(
        [browser, *FLAGS, f"--user-data-dir={tmp_path / 'profile-dom'}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    step_chart = re.search(r'<svg id="step-chart".*?</svg>', dom, re.S)
    assert step_chart and step_chart.group(0).count("<rect") == len([s for s in report["steps"] if s["rank"] == 0])
    assert re.search(r'<svg id="op-chart".*?aten::linear.*?</svg>', dom, re.S)
    assert re.search(r'<svg id="memory-chart".*?<polyline', dom, re.S)
    for finding in report["findings"]:
        assert f'data-rule="{finding["rule_id"]}"' in dom
    assert (
        "with torch.autocast(&quot;tpu&quot;, dtype=torch.bfloat16):" in dom
        or 'with torch.autocast("tpu", dtype=torch.bfloat16):' in dom
    )

    shot = tmp_path / "report.png"
    subprocess.run(
        [
            browser,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'profile-shot'}",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 1600)
