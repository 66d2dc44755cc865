"""`tpu-agent migrate` and `tpu-agent rules` through a real subprocess, on real files and real git repos."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tpu_agent.migrate.report.json_report import load_schema
from tpu_agent.migrate.rules import ALL_RULES

REPO_ROOT = Path(__file__).resolve().parents[2]

CUDA_SOURCE = """import torch


def main():
    model = torch.nn.Linear(4, 4).cuda()
    x = torch.randn(2, 4, device="cuda")
    y = model(x)
    torch.cuda.synchronize()
    return y
"""

PLAIN_SOURCE = "def add(a, b):\n    return a + b\n"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "tpu_agent", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def make_project(root: Path) -> Path:
    project = root / "proj"
    (project / "pkg").mkdir(parents=True)
    (project / "train.py").write_text(CUDA_SOURCE)
    (project / "pkg" / "util.py").write_text(PLAIN_SOURCE)
    return project


def snapshot(tree: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(tree)): p.read_bytes()
        for p in sorted(tree.rglob("*"))
        if p.is_file() and ".git" not in p.parts
    }


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout


def test_version() -> None:
    result = cli("--version", cwd=REPO_ROOT)
    assert result.returncode == 0
    assert result.stdout.strip() == "tpu-agent 0.1.0"


def test_missing_path_exits_2_naming_it(tmp_path: Path) -> None:
    result = cli("migrate", "no/such/dir", cwd=tmp_path)
    assert result.returncode == 2
    assert "no/such/dir" in result.stderr


@pytest.mark.slow
def test_missing_path_with_json_format_prints_a_json_error(tmp_path: Path) -> None:
    result = cli("migrate", "absent.py", "--format", "json", cwd=tmp_path)
    assert result.returncode == 2
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "path-not-found" and "absent.py" in error["message"]


def test_check_exits_1_on_cuda_code_and_writes_nothing(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    before = snapshot(project)
    result = cli("migrate", "--check", "proj", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "proj/train.py:" in result.stdout
    assert snapshot(project) == before


def test_check_exits_0_on_clean_code(tmp_path: Path) -> None:
    make_project(tmp_path)
    result = cli("migrate", "--check", "proj/pkg", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_check_on_the_bundled_example_finds_work(tmp_path: Path) -> None:
    example = REPO_ROOT / "examples" / "cuda_ddp"
    before = snapshot(example)
    result = cli("migrate", "--check", "--format", "json", str(example), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["summary"]["references"] > 0 and report["summary"]["needs_attention"] is True
    assert snapshot(example) == before


def test_diff_prints_a_patch_and_writes_nothing(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    (project / "broken.py").write_text("import torch\nx = torch.cuda.synchronize(\n")
    before = snapshot(project)
    result = cli("migrate", "--diff", "proj", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--- a/proj/train.py" in result.stdout and "+++ b/proj/train.py" in result.stdout
    assert any(line.startswith("-") and "cuda" in line for line in result.stdout.splitlines())
    assert snapshot(project) == before
    # a skipped file is named with its reason in the short summary too (once: no doubled path)
    assert "Skipped files:" in result.stderr
    skipped = [line for line in result.stderr.splitlines() if "broken.py" in line]
    assert len(skipped) == 1 and "does not parse" in skipped[0] and skipped[0].count("broken.py") == 1, skipped


@pytest.mark.slow
def test_default_rewrites_in_place_then_check_is_clean(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    result = cli("migrate", "proj", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (project / "train.py").read_text() != CUDA_SOURCE
    assert (project / "pkg" / "util.py").read_text() == PLAIN_SOURCE
    again = cli("migrate", "proj", "--format", "json", cwd=tmp_path)
    assert again.returncode == 0
    assert json.loads(again.stdout)["applied"]["written"] == []


@pytest.mark.slow
def test_dirty_git_tree_is_refused_unless_allow_dirty(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    git(project, "init", "-q")
    git(project, "add", ".")
    git(project, "commit", "-q", "-m", "cuda version")
    (project / "train.py").write_text(CUDA_SOURCE + "\n# work in progress\n")
    refused = cli("migrate", "proj", cwd=tmp_path)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "train.py" in refused.stderr and "--allow-dirty" in refused.stderr
    assert (project / "train.py").read_text() == CUDA_SOURCE + "\n# work in progress\n"
    allowed = cli("migrate", "proj", "--allow-dirty", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    assert "# work in progress" in (project / "train.py").read_text()
    assert (project / "train.py").read_text() != CUDA_SOURCE + "\n# work in progress\n"


def test_clean_git_tree_is_rewritten_and_git_sees_the_change(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    git(project, "init", "-q")
    git(project, "add", ".")
    git(project, "commit", "-q", "-m", "cuda version")
    result = cli("migrate", "proj", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert git(project, "status", "--porcelain").split() == ["M", "train.py"]


@pytest.mark.slow
def test_output_dir_writes_a_copy_and_refuses_one_inside_the_source(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    before = snapshot(project)
    result = cli("migrate", "proj", "--output-dir", "proj-tpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert snapshot(project) == before
    copy = tmp_path / "proj-tpu"
    assert (copy / "pkg" / "util.py").read_text() == PLAIN_SOURCE
    assert (copy / "train.py").read_text() != CUDA_SOURCE
    assert "Wrote 2 file(s) into" in result.stdout and ": 1 migrated, 1 copied unchanged;" in result.stdout
    rerun = cli("migrate", "proj", "--output-dir", "proj-tpu", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "0 migrated, 0 copied unchanged; 2 already up to date there." in rerun.stdout
    inside = cli("migrate", "proj", "--output-dir", "proj/out", cwd=tmp_path)
    assert inside.returncode == 3
    assert "inside the source" in inside.stderr
    # a file the copy skips is named with its reason, beside the count of files copied unchanged
    (project / "broken.py").write_text("import torch\nx = torch.cuda.synchronize(\n")
    skipping = cli("migrate", "proj", "--output-dir", "proj-tpu-2", cwd=tmp_path)
    assert skipping.returncode == 0, skipping.stderr
    named = skipping.stdout.split("Skipped files:")[1]
    assert "broken.py" in named and "does not parse" in named
    assert ": 1 migrated, 2 copied unchanged;" in skipping.stdout


def test_json_format_is_parseable_and_follows_the_schema(tmp_path: Path) -> None:
    make_project(tmp_path)
    result = cli("migrate", "--check", "--format", "json", "proj", cwd=tmp_path)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    jsonschema.Draft202012Validator(load_schema()).validate(report)
    assert report["schema_version"] == 1
    assert {f["path"] for f in report["findings"]} == {"proj/train.py"}


def test_report_file_gets_the_full_report_and_stdout_the_summary(tmp_path: Path) -> None:
    make_project(tmp_path)
    result = cli("migrate", "--check", "--format", "sarif", "--report", "out.sarif", "proj", cwd=tmp_path)
    assert result.returncode == 1
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"]
    assert "files examined" in result.stdout and "out.sarif" in result.stdout


def test_unknown_rule_selection_exits_2(tmp_path: Path) -> None:
    make_project(tmp_path)
    result = cli("migrate", "--check", "--select", "XYZ9", "proj", cwd=tmp_path)
    assert result.returncode == 2
    assert "XYZ9" in result.stderr


@pytest.mark.slow
def test_rules_lists_every_rule(tmp_path: Path) -> None:
    table = cli("rules", cwd=tmp_path)
    assert table.returncode == 0
    for code in ALL_RULES:
        assert code in table.stdout
    listed = [r for r in json.loads(cli("rules", "--format", "json", cwd=tmp_path).stdout) if r["kind"] == "migration"]
    assert [r["code"] for r in listed] == sorted(ALL_RULES)
    assert {"code", "name", "family", "safety", "summary", "rationale", "before", "after", "reference"} <= set(
        listed[0]
    )


def test_rules_code_explains_one_rule(tmp_path: Path) -> None:
    code = sorted(ALL_RULES)[0]
    rule = ALL_RULES[code]
    result = cli("rules", code.lower(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for text in (rule.code, rule.name, rule.summary, "Why", "Before", "After", "Reference", "Since torch"):
        assert text in result.stdout
    assert rule.before.strip().splitlines()[0] in result.stdout


@pytest.mark.parametrize("code", ["TPU999", "nonsense"])
def test_rules_unknown_code_exits_2(tmp_path: Path, code: str) -> None:
    result = cli("rules", code, cwd=tmp_path)
    assert result.returncode == 2
    assert code.upper() in result.stderr.upper()


@pytest.mark.slow
def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """A large tree shows a rich bar on stderr when stderr is a terminal, and none when it is a pipe."""
    import pty
    import threading

    tree = tmp_path / "big"
    tree.mkdir()
    for index in range(250):
        (tree / f"m{index}.py").write_text(f"VALUE = {index}\n")
    master, slave = pty.openpty()
    captured: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            captured.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    with_tty = subprocess.run(
        [sys.executable, "-m", "tpu_agent", "migrate", "--check", "big"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=slave,
        timeout=120,
    )
    os.close(slave)
    reader.join(timeout=10)
    os.close(master)
    assert with_tty.returncode == 0
    assert "250/250" in b"".join(captured).decode(errors="replace")
    piped = cli("migrate", "--check", "big", cwd=tmp_path)
    assert piped.returncode == 0 and "250/250" not in piped.stderr and piped.stderr == ""


@pytest.mark.slow
def test_rule_and_fix_options_reach_the_plan(tmp_path: Path) -> None:
    make_project(tmp_path)
    narrowed = json.loads(
        cli(
            "migrate", "--check", "--format", "json", "--select", "TPU1", "--ignore", "TPU103", "proj", cwd=tmp_path
        ).stdout
    )
    codes = {f["code"] for f in narrowed["findings"]}
    assert codes and all(c.startswith("TPU1") and c != "TPU103" for c in codes)
    assert narrowed["options"]["select"] == ["TPU1"] and narrowed["options"]["ignore"] == ["TPU103"]
    tpu = json.loads(
        cli("migrate", "--check", "--format", "json", "--target", "tpu", "--unsafe-fixes", "proj", cwd=tmp_path).stdout
    )
    assert tpu["options"]["target"] == "tpu" and tpu["options"]["unsafe_fixes"] is True
