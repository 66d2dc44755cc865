"""The README's quick start is a promise: exactly two commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_quick_start_has_exactly_two_commands() -> None:
    commands = quick_start_commands()
    assert len(commands) == 2, commands
    assert "tpu-agent migrate examples/cuda_ddp" in commands[0]
    assert "tpu-agent run --nproc 2" in commands[0]
    assert commands[1].endswith("pytest -q")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci_script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    test_command = quick_start_commands()[1]
    assert test_command in ci_script.splitlines()


def test_both_commands_install_the_cpu_torch_build_first() -> None:
    for command in quick_start_commands():
        assert command.index("torch==2.13.0") < command.index("pip install -q -e ")
