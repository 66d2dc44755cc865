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
    b, c = tmp_path / "b", tmp_path / "c"
    a = b / "a"
    for d in (a, c):
        d.mkdir(parents=True)
    env = {"CLAUDE_PROJECT_DIR": str(c)}
    assert resolve_workspace(str(a), str(b), env).root == a.resolve()  # narrowing inside --workspace is fine
    assert resolve_workspace(None, str(b), env).source == "--workspace"
    ws = resolve_workspace(None, None, env)
    assert (ws.root, ws.source) == (c.resolve(), "CLAUDE_PROJECT_DIR")
    assert resolve_workspace(str(a), None, {}).source == "argument"  # nothing fixed at start: the argument


@pytest.mark.parametrize("fixed_by", ["flag", "TPU_AGENT_WORKSPACE", "CLAUDE_PROJECT_DIR"])
def test_a_workspace_fixed_at_start_is_a_boundary(tmp_path: Path, fixed_by: str) -> None:
    root, sibling = tmp_path / "ws", tmp_path / "other"
    (root / "sub").mkdir(parents=True)
    sibling.mkdir()
    os.symlink(sibling, root / "link-out")
    configured = str(root) if fixed_by == "flag" else None
    env = {} if fixed_by == "flag" else {fixed_by: str(root)}
    for outside in (str(sibling), str(tmp_path), "/etc", str(root / "sub" / ".." / ".."), str(root / "link-out")):
        with pytest.raises(TpuAgentError) as info:
            resolve_workspace(outside, configured, env)
        assert info.value.code == "workspace-outside-root" and info.value.exit_code == ExitCode.REFUSED, outside
        assert str(root.resolve()) in info.value.hint
    assert resolve_workspace(str(root / "sub"), configured, env).root == (root / "sub").resolve()
    assert resolve_workspace(str(root), configured, env).root == root.resolve()


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
    for escape in [
        "../secret.py",
        "src/../../secret.py",
        str(tmp_path / "secret.py"),
        "link.py",
        "dirlink/secret.py",
        "/etc/passwd",
    ]:
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


def test_state_dir_is_never_followed_through_a_symlink(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, root / ".tpu-agent")
    ws = resolve_workspace(str(root), None, {})
    with pytest.raises(TpuAgentError) as info:
        ws.artefact_dir("plans")
    assert info.value.code == "unsafe-state-dir" and "symlink" in info.value.message
    assert str(root / ".tpu-agent") in info.value.hint
    assert list(elsewhere.iterdir()) == []
    (root / ".tpu-agent").unlink()
    (root / ".tpu-agent").write_text("not a directory")
    with pytest.raises(TpuAgentError) as info:
        ws.artefact_dir("jobs")
    assert info.value.code == "unsafe-state-dir"


def test_every_level_of_the_state_dir_is_checked(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    (root / ".tpu-agent").mkdir(parents=True)
    elsewhere.mkdir()
    os.symlink(elsewhere, root / ".tpu-agent" / "plans")
    os.symlink(elsewhere / "x.json", root / ".tpu-agent" / "planted.json")
    ws = resolve_workspace(str(root), None, {})
    with pytest.raises(TpuAgentError) as info:
        ws.artefact_dir("plans")
    assert info.value.code == "unsafe-state-dir"
    with pytest.raises(TpuAgentError):
        ws.state_file(ws.artefact_dir(), "planted.json")
    jobs = ws.artefact_dir("jobs")
    (jobs / "run-00000000").mkdir()
    with pytest.raises(TpuAgentError) as info:  # a job's own directory must be new
        ws.artefact_dir("jobs", "run-00000000", fresh=True)
    assert info.value.code == "unsafe-state-dir"
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")
def test_a_state_dir_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".tpu-agent").mkdir()
    os.chown(tmp_path / ".tpu-agent", 4242, 4242)
    with pytest.raises(TpuAgentError) as info:
        resolve_workspace(str(tmp_path), None, {}).artefact_dir("plans")
    assert info.value.code == "unsafe-state-dir" and "uid 4242" in info.value.message


@pytest.mark.parametrize("bad", ["a\x00b", "x" * 5000, "d/" + "y" * 300])
def test_unusable_path_text_is_a_clear_refusal(tmp_path: Path, bad: str) -> None:
    ws = resolve_workspace(str(tmp_path), None, {})
    with pytest.raises(TpuAgentError) as info:
        ws.resolve(bad)
    assert info.value.code in {"invalid-argument", "path-not-found"}
    assert len(info.value.message) < 400  # the path is not echoed whole
