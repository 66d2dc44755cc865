"""diagnose on captures someone else wrote: crafted paths never lead outside the log directory, damaged files
give an error naming the file (exit 2, never a traceback), and every percentage stays between 0 and 100."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profile_helpers import run_cli

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.profile.api import diagnose
from tpu_agent.profile.layout import CAPTURE_FILE, OPTIONS_FILE, TRACE_FILE, raw_dir
from tpu_agent.profile.synthetic import write_capture
from tpu_agent.runtime.events import EVENTS_FILE_PATTERN

RAW_FILES = (OPTIONS_FILE, CAPTURE_FILE.format(rank=0), TRACE_FILE.format(rank=0), EVENTS_FILE_PATTERN.format(rank=0))


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its content (symlinks by target), to prove nothing changed."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            out[str(path.relative_to(root))] = os.readlink(path).encode()
        elif path.is_file():
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def _set_option(logdir: Path, **values: object) -> None:
    path = raw_dir(logdir) / OPTIONS_FILE
    options = json.loads(path.read_text(encoding="utf-8"))
    options.update(values)
    path.write_text(json.dumps(options), encoding="utf-8")


@pytest.fixture
def nest(tmp_path: Path) -> tuple[Path, Path]:
    """A capture four directories deep, with a bystander file in every directory above it."""
    logdir = tmp_path / "a" / "b" / "c" / "logdir"
    write_capture(logdir, steps=6)
    for parent in (tmp_path, tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        (parent / "keep.txt").write_text("user data\n", encoding="utf-8")
    return tmp_path, logdir


@pytest.mark.slow
def test_crafted_session_path_is_refused_by_the_cli(nest: tuple[Path, Path]) -> None:
    """The issue's case through the real command line: a session of ``../../..`` used to make diagnose delete
    and write files three directories up."""
    root, logdir = nest
    _set_option(logdir, session="../../..")
    outside = {k: v for k, v in _tree(root).items() if not k.startswith("a/b/c/logdir/")}
    result = run_cli("diagnose", str(logdir), "--format", "json")
    assert result.returncode == ExitCode.REFUSED, result.stderr
    output = result.stdout + result.stderr  # --format json: the error is a JSON document on stdout
    assert "Traceback" not in output and "not a plain file name" in output and OPTIONS_FILE in output
    assert {k: v for k, v in _tree(root).items() if not k.startswith("a/b/c/logdir/")} == outside


@pytest.mark.parametrize("session", ["../../../../escaped", "/tmp/abs-session", "a/../../b", "..", "x\ny", 12, ""])
def test_crafted_session_paths_are_refused(nest: tuple[Path, Path], session: object) -> None:
    root, logdir = nest
    _set_option(logdir, session=session)
    outside = {k: v for k, v in _tree(root).items() if not k.startswith("a/b/c/logdir/")}
    try:
        diagnose(logdir)
    except TpuAgentError as error:
        assert error.exit_code in (ExitCode.REFUSED, ExitCode.USAGE) and OPTIONS_FILE in error.message
    else:
        assert session == ""  # no session named: diagnose picks its own name, inside the log directory
    assert {k: v for k, v in _tree(root).items() if not k.startswith("a/b/c/logdir/")} == outside
    assert not Path("/tmp/abs-session").exists()


def test_session_symlinked_outside_is_refused(nest: tuple[Path, Path]) -> None:
    root, logdir = nest
    target = root / "elsewhere"
    target.mkdir()
    (target / "ALL_HOSTS.op_profile.json").write_text("cached\n", encoding="utf-8")
    (logdir / "plugins" / "profile").mkdir(parents=True)
    (logdir / "plugins" / "profile" / "2026_01_01_00_00_00").symlink_to(target)
    with pytest.raises(TpuAgentError) as error:
        diagnose(logdir)
    assert error.value.code == "path-outside-logdir" and error.value.exit_code == ExitCode.REFUSED
    assert [p.name for p in target.iterdir()] == ["ALL_HOSTS.op_profile.json"]


def test_report_dir_symlinked_outside_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    write_capture(elsewhere, steps=6)  # a real capture, but reached through a symlinked tpu-agent/
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    (logdir / "tpu-agent").symlink_to(elsewhere / "tpu-agent")
    before = _tree(elsewhere)
    with pytest.raises(TpuAgentError) as error:
        diagnose(logdir)
    assert error.value.code == "path-outside-logdir"
    assert _tree(elsewhere) == before


def _plant(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(target)


@pytest.mark.parametrize("name", ["tpu-agent/report.json", "tpu-agent/report.md", "tpu-agent/report.html", "session"])
def test_a_link_planted_at_a_file_diagnose_writes_is_refused(tmp_path: Path, name: str) -> None:
    """Directories were confined, but a report or XSpace file that is itself a link was written through."""
    logdir = tmp_path / "logdir"
    raw = write_capture(logdir, steps=6)
    victim = tmp_path / "victim.txt"
    victim.write_text("user data\n", encoding="utf-8")
    if name == "session":  # the session diagnose (re)writes, with links at every XSpace name it may use
        session = logdir / "plugins" / "profile" / json.loads((raw / OPTIONS_FILE).read_text())["session"]
        for host in ("localhost", "synthetic", "host", socket.gethostname()):
            _plant(session / f"{host}.xplane.pb", victim)
    else:
        _plant(logdir / name, victim)
    with pytest.raises(TpuAgentError) as error:
        diagnose(logdir)
    assert error.value.code == "path-outside-logdir" and str(victim) in error.value.message
    assert victim.read_text(encoding="utf-8") == "user data\n"


def test_a_link_planted_at_the_annotated_copy_of_a_foreign_session_is_refused(tmp_path: Path) -> None:
    logdir = tmp_path / "xprof"  # TensorBoard's layout: <logdir>/plugins/profile/<session>/*.xplane.pb
    session = logdir / "plugins" / "profile" / "2026_01_01_00_00_00"
    shutil.copytree(_foreign_session(tmp_path), session)
    victim = tmp_path / "victim.txt"
    victim.write_text("user data\n", encoding="utf-8")
    for file in session.glob("*.xplane.pb"):
        _plant(session.parent / f"{session.name}_tpu-agent" / file.name, victim)
    with pytest.raises(TpuAgentError) as error:
        diagnose(logdir)
    assert error.value.code == "path-outside-logdir"
    assert victim.read_text(encoding="utf-8") == "user data\n"


@pytest.mark.slow
def test_special_files_in_a_capture_are_named_not_read_by_the_cli(tmp_path: Path) -> None:
    """A link to /dev/zero under a record's name was read until the OOM killer came (and a FIFO hung diagnose:
    the MCP stdio probes replay that one)."""
    trace = write_capture(tmp_path, steps=6) / TRACE_FILE.format(rank=0)
    trace.unlink()
    trace.symlink_to("/dev/zero")
    result = run_cli("diagnose", str(tmp_path), timeout=60)
    assert result.returncode == ExitCode.USAGE, result.stderr
    text = " ".join(result.stderr.split())
    assert "Traceback" not in text and TRACE_FILE.format(rank=0) in text and "not read" in text, text


def _foreign_session(tmp_path: Path) -> Path:
    """An XProf session (as TorchTPU or JAX would leave it): our own capture's xplane, copied elsewhere."""
    source = tmp_path / "source"
    write_capture(source, steps=6)
    diagnose(source)
    session = tmp_path / "xprof" / "session"
    session.mkdir(parents=True)
    for path in (source / "plugins" / "profile").glob("*/*.xplane.pb"):
        shutil.copy(path, session / path.name)
    return session


def test_a_session_given_directly_is_annotated_inside_it(tmp_path: Path) -> None:
    session = _foreign_session(tmp_path)
    (session.parent / "keep.txt").write_text("user data\n", encoding="utf-8")
    before = _tree(session.parent)
    diagnosis = diagnose(session)
    assert all(p.resolve().is_relative_to(session.resolve()) for p in diagnosis.xplane_paths + diagnosis.report_paths)
    after = {k: v for k, v in _tree(session.parent).items() if not k.startswith("session/tpu-agent/")}
    assert after == before


def test_a_single_xplane_file_writes_next_to_it_only(tmp_path: Path) -> None:
    session = _foreign_session(tmp_path)
    (file,) = session.glob("*.xplane.pb")
    before = _tree(session.parent)
    diagnosis = diagnose(file)
    assert all(p.resolve().is_relative_to(session.resolve()) for p in diagnosis.xplane_paths + diagnosis.report_paths)
    assert {k: v for k, v in _tree(session.parent).items() if not k.startswith("session/tpu-agent/")} == before


# -- damaged captures -----------------------------------------------------------------------------------


def _mutations(text: str) -> dict[str, str]:
    """Damage a JSON file the ways disks, editors and attackers do."""
    data = json.loads(text) if not text.lstrip().startswith('{"kind"') else None
    out = {
        "truncated": text[: len(text) // 2],
        "empty": "",
        "not-json": "<html>oops</html>",
        "a-list": "[1, 2, 3]",
        "binary": "\x00\xff\x00garbage",
    }
    if isinstance(data, dict):
        for key in list(data)[:8]:
            out[f"without-{key}"] = json.dumps({k: v for k, v in data.items() if k != key})
            out[f"{key}-as-string"] = json.dumps({**data, key: "x"})
            out[f"{key}-as-null"] = json.dumps({**data, key: None})
            out[f"{key}-as-huge"] = json.dumps({**data, key: 10**30})
            out[f"{key}-as-list"] = json.dumps({**data, key: [[1], {"a": 1}]})
    else:  # the event log: one record per line
        lines = text.splitlines()
        first = json.loads(lines[1])
        for key in first:
            out[f"event-{key}-as-string"] = "\n".join([lines[0], json.dumps({**first, key: "x"}), *lines[2:]])
            out[f"event-{key}-as-null"] = "\n".join([lines[0], json.dumps({**first, key: None}), *lines[2:]])
        out["unknown-kind"] = "\n".join([lines[0], json.dumps({**first, "kind": "nope"}), *lines[2:]])
    return out


def _corpus() -> list[tuple[str, str]]:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        raw = write_capture(Path(scratch), steps=6)
        return [(name, label) for name in RAW_FILES for label in _mutations((raw / name).read_text(encoding="utf-8"))]


@pytest.mark.parametrize(("name", "label"), _corpus())
def test_damaged_raw_file_names_the_file(tmp_path: Path, name: str, label: str) -> None:
    raw = write_capture(tmp_path, steps=6)
    (raw / name).write_text(_mutations((raw / name).read_text(encoding="utf-8"))[label], encoding="utf-8")
    try:
        diagnosis = diagnose(tmp_path)
    except TpuAgentError as error:
        assert error.exit_code in (ExitCode.USAGE, ExitCode.REFUSED)
        assert str(raw) in error.message or name in error.message, error.message
        return
    assert all(0.0 <= f.estimated_saving_pct <= 100.0 for f in diagnosis.findings)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(RAW_FILES), position=st.floats(0, 1), junk=st.binary(min_size=1, max_size=16))
def test_fuzzed_raw_bytes_never_crash(
    tmp_path_factory: pytest.TempPathFactory, name: str, position: float, junk: bytes
) -> None:
    logdir = tmp_path_factory.mktemp("fuzz")
    raw = write_capture(logdir, steps=4)
    data = (raw / name).read_bytes()
    at = int(position * len(data))
    (raw / name).write_bytes(data[:at] + junk + data[at + len(junk) :])
    try:
        diagnose(logdir)
    except TpuAgentError as error:
        assert error.exit_code in (ExitCode.USAGE, ExitCode.REFUSED) and error.message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0, 1), junk=st.binary(max_size=32))
def test_fuzzed_xplane_never_crashes(tmp_path_factory: pytest.TempPathFactory, cut: float, junk: bytes) -> None:
    session = _foreign_session(tmp_path_factory.mktemp("xplane"))
    (file,) = session.glob("*.xplane.pb")
    data = file.read_bytes()
    file.write_bytes(data[: int(cut * len(data))] + junk)
    try:
        diagnose(session)
    except TpuAgentError as error:
        assert error.code in ("damaged-capture", "no-capture") and (
            file.name in error.message or "no " in error.message
        )


DAMAGES = {
    OPTIONS_FILE: '{"steps": ',
    CAPTURE_FILE.format(rank=0): '{"window": "oops"}',
    TRACE_FILE.format(rank=0): '{"traceEvents": [{"cat": "cpu_op", "ph": "X"}]}',
    EVENTS_FILE_PATTERN.format(rank=0): '{"kind": "step", "time_ns": "soon"}\n',
}


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_each_damaged_record_is_a_usage_error_naming_it(tmp_path: Path, name: str) -> None:
    raw = write_capture(tmp_path, steps=6)
    (raw / name).write_text(DAMAGES[name], encoding="utf-8")
    with pytest.raises(TpuAgentError) as error:
        diagnose(tmp_path)
    assert error.value.exit_code == ExitCode.USAGE and name in error.value.message, error.value


@pytest.mark.slow
def test_cli_on_a_damaged_capture_exits_2_naming_the_file(tmp_path: Path) -> None:
    """What the command line makes of any of them (one run: the error's exit code is mapped in one place)."""
    raw = write_capture(tmp_path, steps=6)
    (raw / OPTIONS_FILE).write_text(DAMAGES[OPTIONS_FILE], encoding="utf-8")
    result = run_cli("diagnose", str(tmp_path))
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "Traceback" not in result.stderr and OPTIONS_FILE in result.stderr.replace("\n", "")


@pytest.mark.slow
def test_cli_on_truncated_xplane_exits_2(tmp_path: Path) -> None:
    session = _foreign_session(tmp_path)
    (file,) = session.glob("*.xplane.pb")
    file.write_bytes(file.read_bytes()[:100])
    result = run_cli("diagnose", str(session))
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "Traceback" not in result.stderr and file.name in result.stderr.replace("\n", "")


def test_profile_never_clears_a_raw_dir_that_leads_outside(tmp_path: Path) -> None:
    """`profile` empties LOGDIR/tpu-agent/raw before a capture: never through a symlink to someone's files."""
    from tpu_agent.profile.api import profile
    from tpu_agent.profile.options import ProfileOptions
    from tpu_agent.runtime.api import LaunchTarget

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data.txt").write_text("keep me\n", encoding="utf-8")
    logdir = tmp_path / "logdir"
    (logdir / "tpu-agent").mkdir(parents=True)
    (logdir / "tpu-agent" / "raw").symlink_to(precious)
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n", encoding="utf-8")
    with pytest.raises(TpuAgentError) as error:
        profile(LaunchTarget(str(script), []), ProfileOptions(logdir=logdir))
    assert error.value.code == "path-outside-logdir"
    assert (precious / "data.txt").read_text(encoding="utf-8") == "keep me\n"
