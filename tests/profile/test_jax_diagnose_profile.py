"""`tpu-agent diagnose` on an XSpace written by real JAX (jax.profiler.trace on CPU, in a subprocess: the
profiler server it starts should not outlive the test in pytest's process); the diagnosis itself runs here."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from xprof.profile_data import ProfileData

from tpu_agent.profile.api import diagnose, render

pytestmark = pytest.mark.slow  # launches JAX in a subprocess

JAX_SCRIPT = """
import sys
import jax, jax.numpy as jnp

@jax.jit
def step(x):
    return jnp.tanh(x @ x).sum()

x = jnp.ones((64, 64))
step(x).block_until_ready()
with jax.profiler.trace(sys.argv[1]):
    for i in range(2):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            step(x).block_until_ready()
"""


def test_diagnose_jax_xspace(tmp_path: Path) -> None:
    logdir = tmp_path / "jax"
    subprocess.run([sys.executable, "-c", JAX_SCRIPT, str(logdir)], check=True, capture_output=True, timeout=120)
    (original,) = logdir.glob("plugins/profile/*/*.xplane.pb")
    before = hashlib.sha256(original.read_bytes()).hexdigest()

    report = json.loads(render(diagnose(logdir, chip="v5e"), "json"))
    assert report["capture"]["source"] == "xspace" and report["capture"]["chip"] == "v5e"
    assert report["step_time"]["count"] == 2
    outcomes = {r["rule_id"]: r for r in report["rules"]}
    # Only our own capture records call sites, DataLoader waits and weights: no verdict without them.
    for rule_id in ("HS-1", "IP-1", "SH-2", "EM-1", "SD-1"):
        assert outcomes[rule_id]["status"] == "insufficient_data", outcomes[rule_id]
    assert outcomes["CAP-2"]["status"] == "finding"

    assert hashlib.sha256(original.read_bytes()).hexdigest() == before
    annotated = original.parent.parent / f"{original.parent.name}_tpu-agent" / original.name
    assert [str(annotated)] == report["capture"]["xplane_files"]
    plane = next(p for p in ProfileData.from_file(str(annotated)).planes if p.name == "/host:CPU")
    diagnostics = next(line for line in plane.lines if line.name == "tpu-agent diagnostics")
    assert [e.name.split(":")[0] for e in diagnostics.events] == [f["rule_id"] for f in report["findings"]]
    source_plane = next(p for p in ProfileData.from_file(str(original)).planes if p.name == "/host:CPU")
    assert {line.name for line in plane.lines} == {line.name for line in source_plane.lines} | {"tpu-agent diagnostics"}
    assert (logdir / "tpu-agent" / "report.json").exists()
