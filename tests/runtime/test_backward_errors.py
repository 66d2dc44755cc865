"""Errors beneath a tpu backward (hooks, dispatch, AOTAutograd's trace of a compiled backward) reach the caller
or fall back with an event; before, torch's engine aborted the process (SIGABRT) while unwinding through the
device's stream guard (see tpu_agent.runtime.emulated.device_guard)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_launch_util import REPO, SCRIPTS, clean_env

from tpu_agent.runtime import events


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[events.Event]]:
    events_dir = tmp_path_factory.mktemp("events")
    env = clean_env(PYTHONPATH=str(REPO), TPU_AGENT_COMPILER="xla", TPU_AGENT_EVENTS_DIR=str(events_dir))
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "backward_errors.py")],
        capture_output=True, text=True, check=False, env=env, timeout=600, cwd=SCRIPTS,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]  # -6 was the abort
    return json.loads(proc.stdout.strip().splitlines()[-1]), events.read_events(Path(events_dir))[0]


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
