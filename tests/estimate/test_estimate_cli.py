"""`tpu-agent estimate` end to end: a real script run on the emulated device, its step captured and compiled by
libtpu, the report read back in each format; and the refusals a user meets without the compiler or with bad
arguments (these run in any environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tpu_compiler import needs_tpu_compiler

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]
MLP = SCRIPTS / "mlp_train.py"


def run_cli(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TPU_AGENT_HOOKS", None)
    return subprocess.run(
        [sys.executable, "-m", "tpu_agent", *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout
    )


@pytest.mark.slow  # a CLI subprocess: seconds
def test_unknown_slice_is_refused_with_the_slices_the_compiler_knows() -> None:
    result = run_cli("estimate", "--chip", "v5e-3", str(MLP))
    assert result.returncode == 2
    assert "no v5e slice of 3 chips" in result.stderr and "v5e-4" in result.stderr


@pytest.mark.slow  # a CLI subprocess: seconds
def test_missing_script_is_named() -> None:
    result = run_cli("estimate", "--chip", "v5e", "--format", "json", "no/such/train.py")
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["code"] == "script-not-found"


# Runs the CLI in a Python where libtpu is absent whatever this environment has: its distribution metadata is not
# found (what compiler_status reads) and importing it fails, as on a machine without the [estimate] extra.
_WITHOUT_LIBTPU = """
import importlib.abc, importlib.metadata, runpy, sys

_version = importlib.metadata.version

def version(name):
    if name.lower().startswith("libtpu"):
        raise importlib.metadata.PackageNotFoundError(name)
    return _version(name)

class BlockLibtpu(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "libtpu":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

importlib.metadata.version = version
sys.meta_path.insert(0, BlockLibtpu())
sys.argv = ["tpu-agent", *sys.argv[1:]]
runpy.run_module("tpu_agent", run_name="__main__", alter_sys=True)
"""


def run_cli_without_libtpu(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TPU_AGENT_HOOKS", None)
    command = [sys.executable, "-c", _WITHOUT_LIBTPU, *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


@pytest.mark.slow  # two CLI subprocesses
def test_without_libtpu_the_error_says_what_to_install() -> None:
    result = run_cli_without_libtpu("estimate", "--chip", "v5e-4", str(MLP))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "the TPU compiler is not available: libtpu" in result.stderr
    assert 'pip install "tpu-agent[estimate]"' in result.stderr  # the extra's name survives rich's markup
    doctor = run_cli_without_libtpu("doctor", "--format", "json")
    status = json.loads(doctor.stdout)["tpu_compiler"]
    assert status["available"] is False and "libtpu" in status["reason"]


@needs_tpu_compiler
@pytest.mark.slow
def test_script_step_is_captured_with_roles_and_compiled_for_a_slice(tmp_path: Path) -> None:
    from tpu_agent.cli._output import OutputFormat
    from tpu_agent.cli.estimate import render

    d_model, hidden, batch = 64, 256, 8
    written = tmp_path / "estimate.json"
    result = run_cli(
        "estimate", "--chip", "v5e-4", "--format", "json", "--output", str(written), str(MLP),
        "--d-model", str(d_model), "--hidden", str(hidden), "--batch", str(batch),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"estimate written to {written}" in result.stderr.replace("\n", "")  # stdout stays the script's
    document = json.loads(written.read_text())
    estimate = document["estimate"]
    assert document["schema_version"] == 1 and estimate["target"] == "v5e-4" and estimate["chips"] == 4
    assert estimate["strategy"] == "data-parallel" and estimate["verdict"] == "fits"
    assert document["capture_only"] is False
    parameters = (d_model * hidden + hidden + hidden * d_model + d_model) * 4
    peak = max(estimate["programs"], key=lambda program: program["memory"]["total"])
    # the captured graph's inputs were matched to the model's parameters and AdamW's two moments
    assert peak["memory"]["parameters"] == parameters
    assert peak["memory"]["optimizer_state"] == 2 * parameters
    assert estimate["flops_per_chip_per_step"] > 6 * batch * (parameters / 4) * 0.9 / 4
    assert estimate["step_seconds"] > 0 and peak["hlo"]["fusions"] > 0
    # the same document as the Markdown report (rendered here: a second run would only compile it again)
    text = render(document, OutputFormat.markdown)
    assert "# TPU estimate: v5e-4" in text and "| parameters |" in text and "## Assumptions" in text
