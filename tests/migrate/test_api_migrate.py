"""tpu_agent.migrate.api.apply on real files: in place, into a copy, and every refusal.

Plans are built by hand here so each test controls exactly what a file migrates to; the engine's own
rewrites are tested with the engine, and end to end in test_cli_migrate.py.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.migrate import api
from tpu_agent.migrate.model import FileKind, FileResult, Finding, MigrateOptions, Plan, Safety, sha256_bytes
from tpu_agent.migrate.safety import OUTPUT_MARKER

CUDA = b"import torch\nx = torch.ones(2, device='cuda')\n"
MIGRATED = b"import torch\nx = torch.ones(2, device=DEV)\n"
PLAIN = b"print('hello')\n"


def planned(path: Path, migrated: bytes | None) -> FileResult:
    """A FileResult for ``path`` as it is on disk now, migrating to ``migrated``."""
    data = path.read_bytes()
    findings = [Finding("TPU101", str(path), 2, 25, "device string", Safety.SAFE, True)] if migrated else []
    return FileResult(path, str(path), FileKind.PYTHON, sha256_bytes(data), migrated, findings, lines=data.count(b"\n"))


def make_tree(root: Path) -> Plan:
    """root/train.py (changes), root/pkg/util.py (changes, executable), root/plain.py (does not)."""
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_bytes(CUDA)
    (root / "pkg" / "util.py").write_bytes(CUDA + b"# util\n")
    os.chmod(root / "pkg" / "util.py", 0o755)
    (root / "plain.py").write_bytes(PLAIN)
    files = [
        planned(root / "train.py", MIGRATED),
        planned(root / "pkg" / "util.py", MIGRATED + b"# util\n"),
        planned(root / "plain.py", None),
    ]
    return Plan([root], MigrateOptions(), files)


def test_apply_in_place_writes_migrated_bytes_and_keeps_mode(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)
    result = api.apply(plan)
    assert (root / "train.py").read_bytes() == MIGRATED
    assert (root / "pkg" / "util.py").read_bytes() == MIGRATED + b"# util\n"
    assert (root / "plain.py").read_bytes() == PLAIN
    assert os.stat(root / "pkg" / "util.py").st_mode & 0o777 == 0o755
    assert sorted(result.written) == sorted([(root / "train.py").resolve(), (root / "pkg" / "util.py").resolve()])
    assert result.unchanged == [(root / "plain.py").resolve()]
    assert result.output_dir is None


def test_second_apply_is_a_no_op(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)
    api.apply(plan)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*.py")}
    again = api.apply(plan)
    assert again.written == []
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.py")} == before


def test_stale_plan_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)
    (root / "pkg" / "util.py").write_bytes(CUDA + b"# edited after the plan\n")
    with pytest.raises(TpuAgentError) as caught:
        api.apply(plan)
    assert caught.value.code == "stale-plan"
    assert caught.value.exit_code == ExitCode.REFUSED
    assert "util.py" in caught.value.message
    assert (root / "train.py").read_bytes() == CUDA  # refused before the first write


def test_deleted_file_makes_the_plan_stale(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)
    (root / "train.py").unlink()
    with pytest.raises(TpuAgentError, match="train.py") as caught:
        api.apply(plan)
    assert caught.value.exit_code == ExitCode.REFUSED


def test_failed_write_leaves_the_original_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(TpuAgentError) as caught:
        api.apply(plan)
    assert caught.value.code == "write-failed"
    assert "No space left on device" in caught.value.message
    monkeypatch.undo()
    assert (root / "pkg" / "util.py").read_bytes() == CUDA + b"# util\n"
    assert (root / "train.py").read_bytes() == CUDA
    assert sorted(p.name for p in root.rglob("*")) == ["pkg", "plain.py", "train.py", "util.py"]  # no temp files


def test_symlink_leaving_the_tree_is_never_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "shared.py"
    outside.parent.mkdir()
    outside.write_bytes(CUDA)
    root = tmp_path / "repo"
    root.mkdir()
    (root / "shared.py").symlink_to(outside)
    plan = Plan([root], MigrateOptions(), [planned(root / "shared.py", MIGRATED)])
    with pytest.raises(TpuAgentError) as caught:
        api.apply(plan)
    assert caught.value.code == "path-escape"
    assert caught.value.exit_code == ExitCode.REFUSED
    assert outside.read_bytes() == CUDA
    assert (root / "shared.py").is_symlink()


def test_symlink_inside_the_tree_is_written_once_through_its_target(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "real.py").write_bytes(CUDA)
    (root / "alias.py").symlink_to("real.py")
    plan = Plan([root], MigrateOptions(), [planned(root / "alias.py", MIGRATED), planned(root / "real.py", MIGRATED)])
    result = api.apply(plan)
    assert result.written == [(root / "real.py").resolve()]
    assert (root / "alias.py").is_symlink()
    assert (root / "real.py").read_bytes() == MIGRATED


def test_file_outside_the_given_paths_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)
    stray = tmp_path / "stray.py"
    stray.write_bytes(CUDA)
    plan.files.append(planned(stray, MIGRATED))
    with pytest.raises(TpuAgentError, match="outside the paths being migrated"):
        api.apply(plan)
    assert stray.read_bytes() == CUDA


def test_output_dir_gets_a_migrated_copy_and_the_source_is_untouched(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)
    (root / "data.bin").write_bytes(b"\x00\xff binary")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\x00")
    (root / "link.py").symlink_to("plain.py")
    out = tmp_path / "out"
    result = api.apply(plan, output_dir=out)
    assert (root / "train.py").read_bytes() == CUDA
    assert (out / "train.py").read_bytes() == MIGRATED
    assert (out / "pkg" / "util.py").read_bytes() == MIGRATED + b"# util\n"
    assert os.stat(out / "pkg" / "util.py").st_mode & 0o777 == 0o755
    assert (out / "plain.py").read_bytes() == PLAIN
    assert (out / "data.bin").read_bytes() == b"\x00\xff binary"
    assert os.readlink(out / "link.py") == "plain.py"
    assert not (out / ".git").exists() and not (out / "__pycache__").exists()
    assert (out / OUTPUT_MARKER).is_file()
    assert result.output_dir == out.resolve()
    assert (out / "train.py").resolve() in result.written


def test_output_dir_rerun_reuses_a_previous_output_without_rewriting(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)
    out = tmp_path / "out"
    api.apply(plan, output_dir=out)
    again = api.apply(plan, output_dir=out)
    assert again.written == []
    assert (out / "train.py").read_bytes() == MIGRATED


@pytest.mark.parametrize(
    ("where", "code"),
    [("inside", "output-inside-source"), ("parent", "source-inside-output"), ("nonempty", "output-not-empty")],
)
def test_unsafe_output_dirs_are_refused(tmp_path: Path, where: str, code: str) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)
    out = {"inside": root / "migrated", "parent": tmp_path, "nonempty": tmp_path / "other"}[where]
    if where == "nonempty":
        out.mkdir()
        (out / "notes.txt").write_text("keep me\n")
    with pytest.raises(TpuAgentError) as caught:
        api.apply(plan, output_dir=out)
    assert caught.value.code == code
    assert caught.value.exit_code == ExitCode.REFUSED
    assert not (root / "migrated").exists()
    assert (root / "train.py").read_bytes() == CUDA


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repo), *args],
        check=True,
        capture_output=True,
    )


def test_uncommitted_changes_refuse_in_place_apply_unless_allowed(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)
    git(root, "init", "-q")
    git(root, "add", "train.py", "plain.py")
    git(root, "commit", "-q", "-m", "init")  # pkg/util.py stays untracked: uncommitted work
    with pytest.raises(TpuAgentError) as caught:
        api.apply(plan)
    assert caught.value.code == "dirty-worktree"
    assert caught.value.exit_code == ExitCode.REFUSED
    assert "util.py" in caught.value.message and "train.py" not in caught.value.message
    assert (root / "train.py").read_bytes() == CUDA
    api.apply(plan, allow_dirty=True)
    assert (root / "train.py").read_bytes() == MIGRATED


def test_clean_git_tree_is_rewritten(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    plan = make_tree(root)
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "init")
    assert len(api.apply(plan).written) == 2


def test_plan_names_a_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(TpuAgentError) as caught:
        api.plan([missing], MigrateOptions())
    assert str(missing) in caught.value.message
    assert caught.value.exit_code == ExitCode.USAGE


def test_rule_selection_is_canonical_and_checked_for_every_front_end(tmp_path: Path) -> None:
    """plan() upper-cases select/ignore and refuses codes that match no rule, naming them: the MCP server
    passes an agent's lists straight into MigrateOptions and gets the same checks as the CLI."""
    source = tmp_path / "train.py"
    source.write_text("import torch\nx = torch.zeros(1).cuda()\ntorch.cuda.synchronize()\n")
    lowered = api.plan([source], MigrateOptions(select=frozenset({" tpu1 "}), ignore=frozenset({"tpu2"}), jobs=1))
    assert lowered.options.select == frozenset({"TPU1"}) and lowered.options.ignore == frozenset({"TPU2"})
    assert {f.code for f in lowered.findings} == {"TPU103"}
    for options, bad in (
        (MigrateOptions(select=frozenset({"tpu1", "XYZ9"})), "XYZ9"),
        (MigrateOptions(ignore=frozenset({"TPU99"})), "TPU99"),
    ):
        with pytest.raises(TpuAgentError) as error:
            api.plan([source], options)
        assert error.value.code == "unknown-rule" and bad in error.value.message
        assert error.value.exit_code == ExitCode.USAGE
    with pytest.raises(TpuAgentError) as error:
        api.plan([source], MigrateOptions(select=frozenset({" "})))
    assert error.value.code == "bad-rule-selection"
