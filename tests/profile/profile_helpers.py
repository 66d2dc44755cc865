"""Helpers for the profile tests: run the CLI, find seeded lines, cache real profile runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


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
    """One profile run per (script, options), shared by every test that needs it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[tuple[str, ...], tuple[Path, dict[str, Any], subprocess.CompletedProcess[str]]] = {}

    def get(
        self, script: str, *options: str, args: tuple[str, ...] = ()
    ) -> tuple[Path, dict[str, Any], subprocess.CompletedProcess[str]]:
        """Profile ``script`` with CLI ``options`` (before the script) and script ``args`` (after it).

        Profile's default, without the TPU compiler's pass (``--tpu-compiler``): these captures test the
        profile's own findings; the compiler's are tested on programs compiled directly
        (test_compiled_*_profile.py) and profile's compiler section in tests/estimate."""
        key = (script, *options, "--", *args)
        if key not in self.cache:
            logdir = self.root / f"{Path(script).stem}-{len(self.cache)}"
            result = run_cli(
                "profile",
                "--logdir",
                str(logdir),
                "--steps",
                "5",
                "--warmup",
                "2",
                "--format",
                "json",
                *options,
                str(SCRIPTS / script),
                *args,
            )
            assert result.stdout.strip(), result.stderr[-3000:]
            self.cache[key] = (logdir, json.loads(result.stdout), result)
        return self.cache[key]
