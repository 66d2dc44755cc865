"""Our XSpace files, read back with XProf's own reader and converters (what TensorBoard's Profile tab runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from profile_helpers import Captures
from xprof.convert import raw_to_tool_data
from xprof.profile_data import ProfileData

pytestmark = pytest.mark.slow  # every test here launches `tpu-agent` (and torch) in a subprocess


def _xplanes(report: dict) -> list[str]:
    files = report["capture"]["xplane_files"]
    assert files, "no xplane written"
    for name in files:
        path = Path(name)
        assert path.parent.parent.name == "profile" and path.parent.parent.parent.name == "plugins"
        assert path.name.endswith(".xplane.pb")
    return files


def test_layout_reports_sit_next_to_plugins(captures: Captures) -> None:
    logdir, report, _ = captures.get("host_sync.py")
    session = Path(_xplanes(report)[0]).parent
    assert sorted(p.name for p in (logdir / "tpu-agent").glob("report.*")) == [
        "report.html",
        "report.json",
        "report.md",
    ]
    assert not [p for p in session.iterdir() if p.name.startswith("report")]


def test_profile_data_reader_sees_ops_steps_runtime_and_diagnostics(captures: Captures) -> None:
    _, report, _ = captures.get("host_sync.py")
    data = ProfileData.from_file(_xplanes(report)[0])
    plane = next(p for p in data.planes if p.name == "/host:CPU")
    lines = {line.name: line for line in plane.lines}
    diagnostics = [e.name for e in lines["tpu-agent diagnostics"].events]
    assert sorted(name.split(":")[0] for name in diagnostics) == sorted(f["rule_id"] for f in report["findings"])
    runtime = [e.name for e in lines["tpu-agent runtime"].events]
    assert "host sync (item)" in runtime
    names = [e.name for name, line in lines.items() if name.startswith("python thread") for e in line.events]
    assert "aten::addmm" in names
    assert [n for n in names if n.startswith("ProfilerStep#")] == [f"ProfilerStep#{i}" for i in range(2, 7)]
    hs1 = next(e for e in lines["tpu-agent diagnostics"].events if e.name.startswith("HS-1"))
    stats = dict(hs1.stats)
    assert stats["rule_id"] == "HS-1" and stats["source"].endswith("host_sync.py:15 (<module>)")


def test_xprof_tools_overview_op_stats_and_trace_viewer(captures: Captures) -> None:
    _, report, _ = captures.get("host_sync.py")
    files = _xplanes(report)
    tools = raw_to_tool_data.xspace_to_tool_names(files)
    assert {"overview_page", "framework_op_stats", "trace_viewer@"} <= set(tools)

    overview, _ = raw_to_tool_data.xspace_to_tool_data(files, "overview_page", {})
    tables = json.loads(overview)
    step_rows = next(t["rows"] for t in tables if t.get("cols") and t["cols"][0]["id"] == "stepnum")
    assert len(step_rows) == report["step_time"]["count"] == 5
    averages = [float(t["p"]["steptime_ms_average"]) for t in tables if "steptime_ms_average" in t.get("p", {})]
    assert averages and averages[0] > 0

    op_stats, _ = raw_to_tool_data.xspace_to_tool_data(files, "framework_op_stats", {})
    operations = {row["c"][3]["v"] for row in json.loads(op_stats)[0]["rows"]}
    assert "aten::addmm:addmm" in operations

    trace, _ = raw_to_tool_data.xspace_to_tool_data(files, "trace_viewer", {})
    events = json.loads(trace)["traceEvents"]
    threads = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert {"tpu-agent diagnostics", "tpu-agent runtime"} <= threads
    finding = next(e for e in events if str(e.get("name", "")).startswith("HS-1:"))
    assert finding["args"]["severity"] == "warning"
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert min(s["ts"] for s in steps) <= finding["ts"] <= max(s["ts"] + s["dur"] for s in steps)
    # Op stats are interned (references to stat metadata); the viewer shows the strings, not the ids.
    addmm = next(e for e in events if e.get("name") == "aten::addmm" and "shapes" in e.get("args", {}))
    assert addmm["args"]["shapes"].startswith("[[") and "float" in addmm["args"]["dtypes"]


def test_xprof_cli_reads_the_session(captures: Captures) -> None:
    import subprocess
    import sys

    _, report, _ = captures.get("host_sync.py")
    session = Path(_xplanes(report)[0]).parent
    xprof = Path(sys.executable).with_name("xprof")
    result = subprocess.run(
        [str(xprof), "get_overview", str(session)], capture_output=True, text=True, timeout=120, check=True
    )
    overview = json.loads(result.stdout)
    assert overview["capture"]["files_used"] == [Path(_xplanes(report)[0]).name.removesuffix(".xplane.pb")]
    assert float(overview["performance_summary"]["steptime_ms_average"]) > 0
