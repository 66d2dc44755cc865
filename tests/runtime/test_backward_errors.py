"""Errors beneath a tpu backward (hooks, dispatch, AOTAutograd's trace of a compiled backward) reach the caller
or fall back with an event; before, torch's engine aborted the process (SIGABRT) while unwinding through the
device's stream guard (see tpu_agent.runtime.emulated.device_guard)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runtime_launch_util import REPO, SCRIPTS, clean_env

from tpu_agent.runtime import events


def _run_script(events_dir: Path) -> dict:
    env = clean_env(PYTHONPATH=str(REPO), TPU_AGENT_COMPILER="xla", TPU_AGENT_EVENTS_DIR=str(events_dir))
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "backward_errors.py")],
        capture_output=True, text=True, check=False, env=env, timeout=600, cwd=SCRIPTS,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]  # -6 was the abort
    return {"out": json.loads(proc.stdout.strip().splitlines()[-1]), "events_dir": str(events_dir)}


@pytest.fixture(scope="module")
def run(run_once: Callable[..., Any]) -> tuple[dict, list[events.Event]]:
    """The script's output and its event log: one run per session (run_once), also when pytest-xdist splits this
    module between workers (a torch process that compiles through XLA)."""
    result = run_once("backward-errors", _run_script)
    return result["out"], events.read_events(Path(result["events_dir"]))[0]


def test_eager_backward_errors_reach_the_caller(run: tuple[dict, list[events.Event]]) -> None:
    out, _ = run
    assert out["hook"] == ["ValueError", "hook refused the gradient"]
    assert out["dispatch"] == ["RuntimeError", "index refused"]


def test_bool_mask_index_put_compiles_with_a_graph_break_and_matches_cpu(
    run: tuple[dict, list[events.Event]],
) -> None:
    out, log = run
    assert out["mask_hit"] <= 1e-6 and out["mask_miss"] <= 1e-6
    breaks = [e.reason for e in log if isinstance(e, events.GraphBreak)]
    assert any("failed with aten.nonzero.default" in reason for reason in breaks), breaks


def test_a_backward_aot_cannot_trace_runs_eagerly_with_a_fallback_event(run: tuple[dict, list[events.Event]]) -> None:
    out, log = run
    assert out["custom_op"] <= 1e-5
    fallbacks = [e.op for e in log if isinstance(e, events.FallbackOp)]
    assert any("[xla]" in op and ".numpy() is not supported" in op for op in fallbacks), fallbacks
