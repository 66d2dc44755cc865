"""The workspace sandbox: explicit resolution and refusal of every escape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.plugins.workspace import resolve_workspace


def test_resolution_order_argument_then_flag_then_env(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    env = {"CLAUDE_PROJECT_DIR": str(c)}
    assert resolve_workspace(str(a), str(b), env).root == a.resolve()
    assert resolve_workspace(None, str(b), env).source == "--workspace"
    ws = resolve_workspace(None, None, env)
    assert (ws.root, ws.source) == (c.resolve(), "CLAUDE_PROJECT_DIR")


def test_no_workspace_is_refused_never_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TpuAgentError) as info:
        resolve_workspace(None, None, {})
    assert info.value.code == "no-workspace"
    assert "--workspace" in info.value.hint


@pytest.mark.parametrize("bad", ["relative/dir", "/does/not/exist", "/"])
def test_bad_workspaces(bad: str) -> None:
    with pytest.raises(TpuAgentError) as info:
        resolve_workspace(bad, None, {})
    assert info.value.code in {"workspace-not-absolute", "workspace-not-found", "workspace-too-broad"}


def test_escapes_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "m.py").write_text("x = 1\n")
    (tmp_path / "secret.py").write_text("s = 1\n")
    os.symlink(tmp_path / "secret.py", root / "link.py")
    os.symlink(tmp_path, root / "dirlink")
    os.symlink(root / "src" / "m.py", root / "inner.py")
    ws = resolve_workspace(str(root), None, {})
    assert ws.resolve("src/m.py") == root.resolve() / "src" / "m.py"
    assert ws.resolve(str(root / "src" / "m.py")) == root.resolve() / "src" / "m.py"  # absolute inside is fine
    assert ws.resolve("inner.py") == root.resolve() / "src" / "m.py"  # a link that stays inside is fine
    for escape in ["../secret.py", "src/../../secret.py", str(tmp_path / "secret.py"), "link.py", "dirlink/secret.py", "/etc/passwd"]:
        with pytest.raises(TpuAgentError) as info:
            ws.resolve(escape)
        assert info.value.code == "path-outside-workspace", escape
        assert info.value.exit_code == ExitCode.REFUSED


def test_git_dir_is_never_a_write_target(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("")
    ws = resolve_workspace(str(tmp_path), None, {})
    assert ws.resolve(".git/config")  # reading is allowed
    with pytest.raises(TpuAgentError) as info:
        ws.resolve(".git/config", for_write=True)
    assert info.value.code == "path-in-git-dir"


def test_artefacts_live_under_dot_tpu_agent(tmp_path: Path) -> None:
    ws = resolve_workspace(str(tmp_path), None, {})
    assert ws.artefact_dir("plans") == tmp_path.resolve() / ".tpu-agent" / "plans"
    assert ws.relative(tmp_path / ".tpu-agent" / "plans") == ".tpu-agent/plans"
    assert (tmp_path / ".tpu-agent" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_artefacts_stay_out_of_git_status(tmp_path: Path) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    ws = resolve_workspace(str(tmp_path), None, {})
    (ws.artefact_dir("jobs", "run-1") / "output.log").write_text("log\n")
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert status.stdout == ""


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["..", ".", "a", "b", "link", "", "/"]), min_size=1, max_size=6))
def test_any_resolved_path_stays_inside(tmp_path_factory: pytest.TempPathFactory, parts: list[str]) -> None:
    base = tmp_path_factory.mktemp("prop")
    root = base / "ws"
    (root / "a" / "b").mkdir(parents=True)
    if not (root / "link").exists():
        os.symlink(base, root / "link")
    ws = resolve_workspace(str(root), None, {})
    raw = "/".join(parts)
    try:
        resolved = ws.resolve(raw, must_exist=False)
    except TpuAgentError as error:
        assert error.code == "path-outside-workspace"
    else:
        assert resolved.is_relative_to(root.resolve())
