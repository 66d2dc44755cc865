"""Helpers shared by the launcher tests: run ``tpu-agent`` (or the runtime module) as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import Result
from typer.testing import CliRunner

from tpu_agent.runtime.xla.settings import COMPILER_ENV

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


_LAUNCH_PREFIXES = ("TPU_AGENT_", "TORCH_TPU_", "TPU_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC_")
# Kept from the test session: its graph compiler (tests/conftest.py), which a test that means another sets itself
_SESSION_SETTINGS = frozenset({COMPILER_ENV})


def _launch_setting(name: str) -> bool:
    return name.startswith(_LAUNCH_PREFIXES) and name not in _SESSION_SETTINGS


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any TorchTPU / tpu-agent / torchrun variables but the session's
    graph compiler, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not _launch_setting(k)}
    env.update(extra)
    return env


def run_script(script: str, directory: Path, *args: str, **env: str) -> dict:
    """``script`` run in a fresh interpreter (activation is process-wide) with the repository importable and
    :func:`clean_env`'s environment plus ``env``; its last line of output, as JSON."""
    path = directory / "script.py"
    path.write_text(script)
    proc = subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=str(REPO), **env),
        timeout=300,
        cwd=directory,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tpu_agent_in_process(*args: str, **env: str) -> Result:
    """``tpu-agent ARGS`` run in this process (typer's test runner), with :func:`clean_env`'s environment plus
    ``env`` while it runs: for commands whose behaviour a fresh interpreter adds nothing to (option checks,
    reports), at a fraction of a subprocess's cost."""
    from tpu_agent.cli import app

    overrides: dict[str, str | None] = {k: None for k in os.environ if _launch_setting(k)}
    overrides.update(env)
    return CliRunner().invoke(app, list(args), env=overrides)


def tpu_agent(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m tpu_agent ARGS`` with captured text output."""
    return subprocess.run(
        [sys.executable, "-m", "tpu_agent", *args],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def flat(text: str) -> str:
    """``text`` with runs of whitespace collapsed (rich wraps long error lines at the terminal width)."""
    return " ".join(text.split())
