"""Which graph compiler the emulation uses: op by op by default (see ``settings.DEFAULT_COMPILER`` for why), XLA
with ``--compiler xla``, refused with what to install where the XLA packages cannot be imported; ``doctor`` and
``check`` say which one ran.

The test session pins its compiler (``tests/conftest.py``), so every test here that means the default removes
that pin first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tpu_agent.cli import app
from tpu_agent.errors import TpuAgentError
from tpu_agent.runtime.xla import settings

REPO = Path(__file__).resolve().parents[2]
FACTORIES = REPO / "tests" / "check" / "factories.py"


@pytest.fixture
def default_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(settings.COMPILER_ENV, raising=False)
    return monkeypatch


def test_op_by_op_is_the_default_and_xla_is_a_choice(default_env: pytest.MonkeyPatch) -> None:
    assert settings.compiler() == settings.EAGER
    assert settings.describe() == (settings.EAGER, "default")
    default_env.setenv(settings.COMPILER_ENV, " XLA ")
    assert settings.compiler() == settings.XLA
    assert settings.describe() == (settings.XLA, f"{settings.COMPILER_ENV}=XLA")


def test_without_torchax_xla_is_refused_with_what_to_do(default_env: pytest.MonkeyPatch) -> None:
    default_env.setitem(sys.modules, "torchax", None)  # Python's own "this import is blocked"
    assert settings.resolve(None) == settings.EAGER
    with pytest.raises(TpuAgentError, match="selects the XLA compiler, but torchax cannot be imported"):
        settings.resolve("xla")


def test_doctor_names_the_graph_compiler_and_refuses_a_bad_one(default_env: pytest.MonkeyPatch) -> None:
    report = json.loads(CliRunner().invoke(app, ["doctor", "--format", "json"]).output)
    assert report["graph_compiler"] == {"name": "eager", "source": "default"}
    default_env.setenv(settings.COMPILER_ENV, "xla")
    text = CliRunner().invoke(app, ["doctor"]).output
    assert "graphs      xla (TPU_AGENT_COMPILER=xla;" in text
    default_env.setenv(settings.COMPILER_ENV, "tvm")
    refused = CliRunner().invoke(app, ["doctor"])
    assert refused.exit_code == 2
    assert "TPU_AGENT_COMPILER='tvm' is not a compiler" in refused.output and "Traceback" not in refused.output


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != settings.COMPILER_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "tpu_agent", "check", *args],
        cwd=FACTORIES.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_check_names_the_compiler_its_graphs_ran_through() -> None:
    compiled = _check("factories:good_mlp", "--mode", "defer-and-fuse", "--compiler", "xla", "--format", "json")
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    report = json.loads(compiled.stdout)
    assert report["compiler"] == "xla" and report["status"] == "pass"
    default = _check("factories:good_mlp", "--mode", "strict")
    assert default.returncode == 0, default.stderr[-3000:]
    assert "graphs run op by op" in " ".join(default.stdout.split())
    bad = _check("factories:good_mlp", "--compiler", "tvm")
    assert bad.returncode == 2 and "tvm" in bad.stderr
