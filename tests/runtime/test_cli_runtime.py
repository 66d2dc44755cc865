"""``tpu-agent run`` argument handling: what belongs to tpu-agent and what to the script, and bad options."""

from __future__ import annotations

from pathlib import Path

from runtime_launch_util import flat, tpu_agent

ECHO = "import os, sys\nprint(sys.argv[1:], os.environ.get('EXTRA'), os.environ.get('TPU_AGENT_CHIP'))\n"


def test_options_after_the_script_and_after_double_dash_belong_to_the_script(tmp_path: Path) -> None:
    (tmp_path / "echo.py").write_text(ECHO)
    result = tpu_agent("run", "--backend", "emulated", "--env", "EXTRA=yes", "--chip", "v5p", "echo.py", "--nproc", "4", "--", "-x", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['--nproc', '4', '--', '-x'] yes v5p"
    dashed = tpu_agent("run", "--backend", "emulated", "--", "echo.py", "--help", cwd=tmp_path)
    assert dashed.returncode == 0, dashed.stderr
    assert dashed.stdout.strip() == "['--help'] None v6e"


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    (tmp_path / "echo.py").write_text(ECHO)
    for args, mentions in (
        (["--nproc", "0", "echo.py"], "--nproc"),
        (["--chip", "v9", "echo.py"], "v9"),
        (["--eager-mode", "lazy", "echo.py"], "lazy"),
        (["--env", "NOEQUALS", "echo.py"], "NOEQUALS"),
        (["--timeout", "-1", "echo.py"], "--timeout"),
        ([], "SCRIPT"),
    ):
        result = tpu_agent("run", *args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert mentions in flat(result.stderr), (args, result.stderr)


def test_help_documents_the_launcher() -> None:
    result = tpu_agent("run", "--help", env=None)
    text = flat(result.stdout)
    for option in ("--nproc", "--backend", "--chip", "--eager-mode", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-backend", "--master-port", "--timeout", "-m"):
        assert option in text
    assert "tpu-agent run --nproc 2" in text
