"""Which graph compiler the emulation uses: XLA by default (as TorchTPU compiles its graphs with XLA), op by op
with ``--compiler eager``, and the op-by-op fallback where the XLA packages cannot be imported; ``doctor`` and
``check`` say which one ran.

The test session itself runs graphs op by op (``tests/conftest.py`` pins ``TPU_AGENT_COMPILER=eager``), so every
test here that means the default removes that pin first.
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


def test_xla_is_the_default_and_eager_is_a_choice(default_env: pytest.MonkeyPatch) -> None:
    assert settings.compiler() == settings.XLA
    assert settings.describe() == (settings.XLA, "default")
    default_env.setenv(settings.COMPILER_ENV, " Eager ")
    assert settings.compiler() == settings.EAGER
    assert settings.describe() == (settings.EAGER, f"{settings.COMPILER_ENV}=Eager")


def test_without_torchax_the_default_falls_back_to_op_by_op_and_says_why(default_env: pytest.MonkeyPatch) -> None:
    default_env.setitem(sys.modules, "torchax", None)  # Python's own "this import is blocked"
    assert settings.resolve(None) == settings.EAGER
    name, source = settings.describe()
    assert name == settings.EAGER
    assert source == "the default, xla, needs torchax, which cannot be imported"
    with pytest.raises(TpuAgentError, match="selects the XLA compiler, but torchax cannot be imported"):
        settings.resolve("xla")  # an explicit choice is refused, not silently downgraded


def test_doctor_names_the_graph_compiler_and_refuses_a_bad_one(default_env: pytest.MonkeyPatch) -> None:
    report = json.loads(CliRunner().invoke(app, ["doctor", "--format", "json"]).output)
    assert report["graph_compiler"] == {"name": "xla", "source": "default"}
    text = CliRunner().invoke(app, ["doctor"]).output
    assert "graphs      xla (default;" in text
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
def test_check_runs_deferred_graphs_through_xla_by_default_and_names_the_compiler() -> None:
    default = _check("factories:good_mlp", "--mode", "defer-and-fuse", "--format", "json")
    assert default.returncode == 0, default.stderr[-3000:]
    report = json.loads(default.stdout)
    assert report["compiler"] == "xla" and report["status"] == "pass"
    eager = _check("factories:good_mlp", "--mode", "strict", "--compiler", "eager")
    assert eager.returncode == 0, eager.stderr[-3000:]
    assert "graphs run op by op" in " ".join(eager.stdout.split())
    bad = _check("factories:good_mlp", "--compiler", "tvm")
    assert bad.returncode == 2 and "tvm" in bad.stderr
