"""No input crashes or hangs migrate: one regression test per class of hostile or unlucky input.

Crashes and hangs are tested through the real command line in a subprocess with a timeout, so a regression
fails the test (timeout, signal exit status) instead of taking the test run down with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpu_agent.migrate import api
from tpu_agent.migrate.engine.discovery import STALE_TEMP_AGE_S
from tpu_agent.migrate.engine.worker import InvalidOutput, _check_output
from tpu_agent.migrate.model import MigrateOptions

CUDA = "import torch\nx = torch.zeros(2).cuda()\n"
MIGRATED_LINE = "x = torch.zeros(2).to(DEVICE)"


def run_cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "tpu_agent", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def files_by_path(report: dict[str, object]) -> dict[str, dict[str, object]]:
    return {entry["path"]: entry for entry in report["files"]}  # type: ignore[index, union-attr]


@pytest.mark.slow
def test_deep_nesting_is_skipped_with_its_line_and_the_run_goes_on(tmp_path: Path) -> None:
    """A few thousand nested brackets used to segfault libcst's parser (rc 139, or BrokenProcessPool)."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "deep.py").write_text(
        "import torch\nx = 1\ny = " + "(" * 5000 + "torch.zeros(1).cuda()" + ")" * 5000 + "\n"
    )
    (project / "lists.py").write_text("import torch\nz = " + "[" * 3000 + "'cuda'" + "]" * 3000 + "\n")
    # enough bytes to use the worker pool, so a crash there would break the pool (in long string literals:
    # they count as work but parse in one token, which keeps the test cheap)
    for i in range(12):
        (project / f"train{i}.py").write_text(CUDA + f"NOTES = {'x' * 24_000!r}\n")
    result = run_cli("migrate", "--check", "--jobs", "2", "--format", "json", "proj", cwd=tmp_path)
    assert result.returncode == 1, result.stderr  # findings in the other files; no signal, no traceback
    report = json.loads(result.stdout)
    files = files_by_path(report)
    assert files["proj/deep.py"]["status"] == "skipped"
    assert str(files["proj/deep.py"]["skipped_reason"]).startswith("proj/deep.py:3:")
    assert "too many nested parentheses" in str(files["proj/deep.py"]["skipped_reason"])
    assert str(files["proj/lists.py"]["skipped_reason"]).startswith("proj/lists.py:2:")
    assert all(files[f"proj/train{i}.py"]["status"] == "changed" for i in range(12))


@pytest.mark.slow
def test_a_file_over_the_time_budget_is_skipped_and_the_rest_migrated(tmp_path: Path) -> None:
    """Valid Python whose libcst parse takes longer than the budget is cut off by it: a 2,900-long call chain (near
    the longest CPython compiles) takes libcst ~2.3 s here, its time growing with the square of the length."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "chain.py").write_text("import torch\n\nf = torch.cuda.synchronize" + "()" * 2900 + "\n")
    (project / "sum.py").write_text("import torch\ny = torch.ones(1).cuda() + " + "+".join(["1"] * 20_000) + "\n")
    (project / "train.py").write_text(CUDA)
    started = time.monotonic()
    result = run_cli("migrate", "--check", "--file-budget", "1", "--format", "json", "proj", cwd=tmp_path, timeout=90)
    assert time.monotonic() - started < 60
    assert result.returncode == 1, result.stderr
    files = files_by_path(json.loads(result.stdout))
    chain = str(files["proj/chain.py"]["skipped_reason"])
    assert chain.startswith("proj/chain.py:3: skipped:") and "1 s per-file time budget" in chain, chain
    assert str(files["proj/sum.py"]["skipped_reason"]).startswith("proj/sum.py:2:")
    assert files["proj/train.py"]["status"] == "changed"


@pytest.mark.slow
def test_deep_code_python_accepts_is_still_migrated(tmp_path: Path) -> None:
    """Nesting past the in-process limit but within Python's own is migrated in the sacrificial process."""
    path = tmp_path / "nested.py"
    path.write_text("import torch\nx = " + "[" * 190 + "torch.zeros(1).cuda()" + "]" * 190 + "\n")
    result = api.plan([path], MigrateOptions(jobs=1)).files[0]
    assert result.skipped_reason is None
    assert result.migrated_bytes is not None and b"torch.zeros(1).to(DEVICE)" in result.migrated_bytes


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_special_files_are_not_read(tmp_path: Path) -> None:
    """A FIFO named *.py blocked the reader forever; it is reported and left alone (also by --output-dir)."""
    project = tmp_path / "proj"
    project.mkdir()
    os.mkfifo(project / "pipe.py")
    (project / "train.py").write_text(CUDA)
    result = run_cli("migrate", "--check", "--format", "json", "proj", cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.stderr
    files = files_by_path(json.loads(result.stdout))
    assert files["proj/pipe.py"]["skipped_reason"] == "proj/pipe.py: a FIFO: not read"
    explicit = run_cli("migrate", "--check", "proj/pipe.py", cwd=tmp_path, timeout=60)
    assert explicit.returncode == 0 and "a FIFO: not read" in explicit.stdout
    copy = run_cli("migrate", "--output-dir", "out", "proj", cwd=tmp_path, timeout=60)
    assert copy.returncode == 0, copy.stderr
    assert (tmp_path / "out" / "train.py").read_text().count("DEVICE") >= 2
    assert not (tmp_path / "out" / "pipe.py").exists()
    assert "pipe.py: a FIFO, not a regular file" in copy.stdout.replace("\n", " ")


def test_a_file_that_vanishes_during_the_plan_is_reported(tmp_path: Path) -> None:
    """It used to end the run with exit status 4 and a FileNotFoundError traceback."""
    (tmp_path / "a.py").write_text("print('no accelerator here')\n")  # dismissed at once: progress is called
    for name in ("b.py", "c.py"):
        (tmp_path / name).write_text(CUDA)

    def progress(done: int, total: int) -> None:  # a.py is done: b.py goes before it is read
        if done == 1:
            (tmp_path / "b.py").unlink()

    plan = api.plan([tmp_path], MigrateOptions(jobs=1), progress)
    by_name = {Path(f.display_path).name: f for f in plan.files}
    assert "could not be read" in str(by_name["b.py"].skipped_reason) and by_name["b.py"].migrated_bytes is None
    assert by_name["c.py"].changed
    result = api.apply(plan)  # the gone file is not written back
    assert not (tmp_path / "b.py").exists() and len(result.written) == 1


def _temp_file(directory: Path, target: str, age_s: float) -> Path:
    path = directory / f".{target}.k3x9_a0q.tpu-agent-tmp"
    path.write_text("half of a file")
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


@pytest.mark.slow
def test_stale_temp_files_of_a_killed_run_are_removed_by_the_next_run(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "pkg").mkdir(parents=True)
    (project / "train.py").write_text(CUDA)
    stale = _temp_file(project / "pkg", "model.py", STALE_TEMP_AGE_S + 60)  # what kill -9 mid-write leaves
    fresh = _temp_file(project, "train.py", -3600)  # touched just now (the clock says later): a write in progress
    lookalike = project / ".notes.tpu-agent-tmp"  # not our naming
    lookalike.write_text("user data")
    check = run_cli("migrate", "--check", "proj", cwd=tmp_path)
    assert check.returncode == 1 and stale.exists()  # --check writes and deletes nothing
    result = run_cli("migrate", "proj", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not stale.exists() and fresh.exists() and lookalike.exists()
    assert "Removed 1 temporary file(s) an interrupted run left" in result.stdout.replace("\n", " ")
    assert MIGRATED_LINE in (project / "train.py").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="watches the run's child processes in /proc")
def test_sigterm_stops_an_in_place_run_like_ctrl_c(tmp_path: Path) -> None:
    """Every file ends whole (old or new), no temporary file is left, and the process exits, not killed."""
    project = tmp_path / "proj"
    project.mkdir()
    body = CUDA + "".join(f"v{j} = torch.ones({j}).cuda()\n" for j in range(300))
    for i in range(150):
        (project / f"m{i}.py").write_text(body)
    env = {**os.environ, "NO_COLOR": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "tpu_agent", "migrate", "--jobs", "2", "proj"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    deadline = time.monotonic() + 60
    while not children.read_text().strip() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the worker pool starts inside the run, once the SIGTERM handler is in place
    assert process.poll() is None, "the run ended before it could be interrupted: make the tree larger"
    process.send_signal(signal.SIGTERM)
    try:
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode is not None and process.returncode > 0  # unwound through Python, not killed
    assert not list(project.glob(".*.tpu-agent-tmp"))
    for path in project.glob("*.py"):
        text = path.read_text()
        assert text == body or (text.count(".to(DEVICE)") == 301 and ".cuda()" not in text), path


def test_notebook_syntax_errors_name_the_cell_and_the_position_in_it(tmp_path: Path) -> None:
    notebook = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# title"]},
            {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": [CUDA]},
            {
                "cell_type": "code",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
                "source": ["%matplotlib inline\n", "y = 1\n", "z = (y +* 2)\n"],
            },
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook, indent=1))
    result = api.plan([path], MigrateOptions(jobs=1)).files[0]
    assert result.skipped_reason is not None
    assert result.skipped_reason.startswith(
        f"{result.display_path}:3:9: does not parse as Python 3 (cell 3: invalid syntax)"
    )  # column of "*", 1-based


@pytest.mark.slow
def test_overlong_paths_are_usage_errors_in_every_command(tmp_path: Path) -> None:
    """A 100,000-character path made `migrate` (and diagnose, run, profile, estimate) end with an OSError
    traceback and exit code 4; it is a usage error naming the start of the path, whatever the command."""
    from typer.testing import CliRunner

    from tpu_agent.cli import app

    long_name = "x" * 100_000
    result = run_cli("migrate", "--check", long_name, cwd=tmp_path, timeout=60)  # the original report, for real
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "File name too long" in result.stderr and "(100000 characters)" in result.stderr
    assert len(result.stderr) < 1000
    (tmp_path / "train.py").write_text(CUDA)
    for args in (
        ["diagnose", long_name],
        ["run", "--backend", "emulated", f"{long_name}.py"],
        ["profile", f"{long_name}.py"],
        ["estimate", f"{long_name}.py"],
        ["migrate", "--output-dir", long_name, str(tmp_path / "train.py")],
        ["migrate", "--check", "--format", "json", long_name],
        ["rules", long_name],
        ["migrate", "--check", "--select", long_name, str(tmp_path / "train.py")],
    ):
        outcome = CliRunner().invoke(app, args)
        assert outcome.exit_code == 2 and not isinstance(outcome.exception, OSError), (args[:2], outcome.output[-500:])
        assert long_name[:1000] not in outcome.output, args[:2]  # the argument is named, not echoed whole


def test_output_that_does_not_parse_is_not_written() -> None:
    """A rule that writes an expression where an assignment target stood would break a working file: the
    worker's check refuses such output, so the file is reported and left as it was."""
    _check_output("self.is_cuda = x.device.type == 'tpu'\n")
    with pytest.raises(InvalidOutput, match="line 1: cannot assign to comparison"):
        _check_output("(self.device.type == 'tpu') = True\n")


def test_only_the_generated_statements_of_a_spliced_output_are_parsed() -> None:
    """A spliced output is checked by parsing the statements the rewrite generated; the rest is the source's own
    text, which parsed already. An error in a generated statement is placed on its line in the whole output."""
    code = "import torch\n\n(self.device.type == 'tpu') = True\nx = 1\n"
    _check_output(code, [(len(code) - 6, "x = 1\n")])
    with pytest.raises(InvalidOutput, match="line 3: cannot assign to comparison"):
        _check_output(code, [(14, "(self.device.type == 'tpu') = True\n"), (len(code) - 6, "x = 1\n")])
