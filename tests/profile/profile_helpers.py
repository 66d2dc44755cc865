"""Helpers for the profile tests: run the CLI, find seeded lines, cache real profile runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]
# The seeded suite: (script, the rule it must show at its `# SEED: <rule>` line, the profile options it needs).
SEEDED: list[tuple[str, str, tuple[str, ...]]] = [
    ("host_sync.py", "HS-1", ()),
    ("dynamic_shapes.py", "SH-1", ()),
    ("fp32_odd_dims.py", "PR-1", ()),
    ("fp32_odd_dims.py", "SH-2", ()),
    ("memory_fit.py", "SD-1", ("--chip", "v5e")),
    ("strict_eager.py", "EM-1", ()),
    ("slow_loader.py", "IP-1", ()),
    ("graph_break.py", "CO-2", ()),
    ("recompile.py", "CO-1", ()),
    ("finetune_unfreeze.py", "CO-1", ()),  # requires_grad flipped by unfreezing: named at the flip
    ("fused_accumulation_reads.py", "EM-2", ()),  # Fused eager switched on in the script, cut by .item() reads
    ("classifier_syncs.py", "HS-2", ()),
    ("memory_growth.py", "SD-8", ()),
]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tpu_agent ARGS`` the way a user would (fresh process, real runtime)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TPU_AGENT_EVENTS_DIR", None)
    env.pop("TPU_AGENT_HOOKS", None)
    return subprocess.run(
        [sys.executable, "-m", "tpu_agent", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env=env,
        timeout=timeout,
    )


def seed_line(script: Path, rule_id: str) -> int:
    """The line a seeded script marks with ``# SEED: <rule_id>``."""
    for number, text in enumerate(script.read_text(encoding="utf-8").splitlines(), start=1):
        if f"# SEED: {rule_id}" in text:
            return number
    raise AssertionError(f"{script} has no '# SEED: {rule_id}' marker")


class Captures:
    """One profile run per (script, options) and test session, shared by every test that needs it.

    The runs go through the session's ``run_once`` (tests/conftest.py): tests of one script sit in several modules
    (host_sync.py's in four), which pytest-xdist spreads over its workers, and each worker would otherwise run the
    same ``tpu-agent profile`` again. The log directory is shared too: tests read it, never change it."""

    def __init__(self, run_once: Callable[[str, Callable[[Path], Any]], Any]) -> None:
        self.run_once = run_once
        self.cache: dict[tuple[str, ...], tuple[Path, dict[str, Any], subprocess.CompletedProcess[str]]] = {}

    def get(
        self, script: str, *options: str, args: tuple[str, ...] = (), verify: bool = False
    ) -> tuple[Path, dict[str, Any], subprocess.CompletedProcess[str]]:
        """Profile ``script`` with CLI ``options`` (before the script) and script ``args`` (after it); ``verify``
        checks every diff with a run of the patched copy (off by default in the suite: tests/conftest.py).

        Profile's default, without the TPU compiler's pass (``--tpu-compiler``): these captures test the
        profile's own findings; the compiler's are tested on programs compiled directly
        (test_compiled_*_profile.py) and profile's compiler section in tests/estimate."""
        options = (*options, "--verify") if verify else options
        key = (script, *options, "--", *args)
        if key not in self.cache:

            def profile(directory: Path) -> dict[str, Any]:
                logdir = directory / "logdir"
                command = ("profile", "--logdir", str(logdir), "--steps", "5", "--warmup", "2", "--format", "json")
                result = run_cli(*command, *options, str(SCRIPTS / script), *args)
                assert result.stdout.strip(), result.stderr[-3000:]
                return {"logdir": str(logdir), "args": result.args, "returncode": result.returncode,
                        "stdout": result.stdout, "stderr": result.stderr}  # fmt: skip

            digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:12]
            run = self.run_once(f"profile-{Path(script).stem}-{digest}", profile)
            result = subprocess.CompletedProcess(run["args"], run["returncode"], run["stdout"], run["stderr"])
            self.cache[key] = (Path(run["logdir"]), json.loads(result.stdout), result)
        return self.cache[key]
