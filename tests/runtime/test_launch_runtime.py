"""``tpu-agent run`` / ``python -m tpu_agent run`` behave like ``python SCRIPT`` on the emulated device."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from runtime_launch_util import clean_env, flat, tpu_agent

pytestmark = pytest.mark.slow  # every test launches fresh torch processes

PROBE = textwrap.dedent(
    """
    import json, os, sys
    import torch
    x = torch.ones(2, device="tpu")
    print(json.dumps({
        "argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0], "cwd": os.getcwd(),
        "device": str(x.device), "is_main": sys.modules["__main__"].__dict__ is globals(),
        "launch_blocking": os.environ.get("TORCH_TPU_LAUNCH_BLOCKING"),
        "defer_and_fuse": os.environ.get("TORCH_TPU_DEFER_AND_FUSE"),
        "eager_mode": str(torch.tpu.eager_mode),
        "chip": os.environ.get("TPU_AGENT_CHIP"),
        "world_size": os.environ.get("WORLD_SIZE"),
    }))
    """
)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_script_sees_plain_python_argv_main_path_and_cwd(tmp_path: Path) -> None:
    _write(tmp_path / "sub" / "probe.py", PROBE)
    workdir = tmp_path / "work"
    workdir.mkdir()
    result = tpu_agent(
        "run",
        "--backend",
        "emulated",
        "--eager-mode",
        "debug",
        "--chip",
        "v5e",
        "../sub/probe.py",
        "--lr",
        "3",
        "-m",
        "x",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["argv"] == ["../sub/probe.py", "--lr", "3", "-m", "x"]
    assert seen["name"] == "__main__" and seen["is_main"]
    assert seen["file"] == str(tmp_path / "sub" / "probe.py")
    assert seen["path0"] == str((tmp_path / "sub").resolve())
    assert seen["cwd"] == str(workdir)
    assert seen["device"] == "tpu:0"
    assert seen["launch_blocking"] == "1" and seen["defer_and_fuse"] is None
    assert "DEFER_NEVER_AND_LAUNCH_BLOCKING" in seen["eager_mode"]
    assert seen["chip"] == "v5e"
    assert seen["world_size"] is None  # one process: no rendezvous variables, as under plain python


def test_python_dash_m_tpu_agent_run_runs_a_module_as_python_dash_m_does(tmp_path: Path) -> None:
    _write(tmp_path / "pkg" / "__init__.py", "")
    _write(tmp_path / "pkg" / "train.py", PROBE)
    result = subprocess.run(
        [sys.executable, "-m", "tpu_agent", "run", "--backend", "emulated", "--eager-mode", "defer-and-fuse", "-m", "pkg.train", "--epochs", "1"],
        cwd=tmp_path, env=clean_env(TORCH_TPU_LAUNCH_BLOCKING="1"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["argv"] == [str(tmp_path / "pkg" / "train.py"), "--epochs", "1"]
    assert seen["name"] == "__main__" and seen["is_main"]
    assert seen["path0"] == str(tmp_path)
    # --eager-mode overrides a stale switch from the shell: TorchTPU would otherwise prefer launch blocking
    assert seen["defer_and_fuse"] == "1" and seen["launch_blocking"] is None
    assert "DEFER_AND_FUSE" in seen["eager_mode"]


def test_exceptions_exit_codes_and_tracebacks_match_plain_python(tmp_path: Path) -> None:
    script = _write(
        tmp_path / "fail.py",
        "import sys\n\ndef inner():\n    raise ValueError('boom')\n\nif sys.argv[1] == 'raise':\n    inner()\nsys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])\n",
    )
    for argv, code in ((["raise"], 1), (["7"], 7)):
        ours = tpu_agent("run", "--backend", "emulated", script.name, *argv, cwd=tmp_path)
        plain = subprocess.run([sys.executable, script.name, *argv], cwd=tmp_path, capture_output=True, text=True)
        assert ours.returncode == plain.returncode == code, (argv, ours.stderr)
        # the script's own stderr (traceback or sys.exit message) is exactly what python prints: no frames
        # of the bootstrap or runpy above the user's
        assert ours.stderr.endswith(plain.stderr), (argv, ours.stderr, plain.stderr)
        assert "tpu_agent" not in ours.stderr.split("Traceback")[-1]


def test_missing_script_and_module_are_usage_errors(tmp_path: Path) -> None:
    missing = tpu_agent("run", "nope.py", cwd=tmp_path)
    assert missing.returncode == 2
    assert "nope.py" in flat(missing.stderr) and "no such script" in flat(missing.stderr)
    no_module = tpu_agent("run", "-m", "no_such_pkg_xyz.train", cwd=tmp_path)
    assert no_module.returncode == 2 and "no_such_pkg_xyz.train" in flat(no_module.stderr)
    _write(tmp_path / "pkg" / "__init__.py", "")
    no_leaf = tpu_agent("run", "--backend", "emulated", "-m", "pkg.missing", cwd=tmp_path)
    assert no_leaf.returncode == 2 and "pkg.missing" in flat(no_leaf.stderr)


def test_timeout_stops_the_script(tmp_path: Path) -> None:
    _write(tmp_path / "slow.py", "import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    # the limit leaves room for torch's import and the device's start on a loaded 2-core machine (6 s did not)
    result = tpu_agent("run", "--backend", "emulated", "--timeout", "15", "slow.py", cwd=tmp_path, timeout=90)
    assert result.returncode == 124
    assert "started" in result.stdout
    assert "time limit of 15 s" in result.stderr


def test_hooks_run_before_user_code_and_their_callables_at_exit_even_on_error(tmp_path: Path) -> None:
    _write(
        tmp_path / "hooks" / "myhooks.py",
        textwrap.dedent(
            """
            import os, torch
            from pathlib import Path
            OUT = Path(os.environ["HOOK_OUT"])
            def setup():
                OUT.joinpath("setup").write_text(str(torch.ones(1, device="tpu").device))
                return lambda: OUT.joinpath("teardown").write_text("ran")
            def second():
                OUT.joinpath("order").write_text("second after setup: " + str(OUT.joinpath("setup").exists()))
            """
        ),
    )
    _write(
        tmp_path / "script.py",
        "import os\nfrom pathlib import Path\nassert Path(os.environ['HOOK_OUT'], 'setup').exists()\nraise SystemExit(5)\n",
    )
    env = clean_env(
        PYTHONPATH=str(tmp_path / "hooks"), HOOK_OUT=str(tmp_path), TPU_AGENT_HOOKS="myhooks:setup, myhooks:second"
    )
    result = tpu_agent("run", "--backend", "emulated", "script.py", cwd=tmp_path, env=env)
    assert result.returncode == 5, result.stderr
    assert (tmp_path / "setup").read_text() == "tpu:0"  # activation happened before the hook
    assert (tmp_path / "order").read_text() == "second after setup: True"
    assert (tmp_path / "teardown").read_text() == "ran"

    broken = tpu_agent(
        "run", "--backend", "emulated", "script.py", cwd=tmp_path, env=clean_env(TPU_AGENT_HOOKS="nomodule_xyz:setup")
    )
    assert broken.returncode == 2 and "nomodule_xyz:setup" in flat(broken.stderr)


def test_second_privateuse1_backend_is_refused(tmp_path: Path) -> None:
    # sitecustomize runs before the bootstrap: it claims PrivateUse1 the way another accelerator plugin would
    _write(tmp_path / "site" / "sitecustomize.py", "import torch\ntorch.utils.rename_privateuse1_backend('npu')\n")
    _write(tmp_path / "script.py", "print('user code ran')\n")
    result = tpu_agent(
        "run", "--backend", "emulated", "script.py", cwd=tmp_path, env=clean_env(PYTHONPATH=str(tmp_path / "site"))
    )
    assert result.returncode == 3
    assert "'npu'" in flat(result.stderr) and "PrivateUse1" in flat(result.stderr)
    assert "user code ran" not in result.stdout


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the death signal is Linux's PR_SET_PDEATHSIG")
def test_ranks_and_agent_die_with_a_sigkilled_launcher(tmp_path: Path) -> None:
    """SIGKILL (or the OOM killer) gives the launcher no chance to stop anything: the ranks of a one-process
    and of a two-process run, and the two-process run's elastic agent, must still end with it."""
    _write(tmp_path / "sleeper.py", "import os, time\nprint('rank', os.getpid(), os.getppid(), flush=True)\n"
           "time.sleep(300)\n")  # fmt: skip
    launchers = {
        nproc: subprocess.Popen(
            [sys.executable, "-m", "tpu_agent", "run", "--backend", "emulated", "--nproc", str(nproc), "sleeper.py"],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for nproc in (1, 2)
    }
    started: set[int] = set()
    try:
        for nproc, launcher in launchers.items():
            for _ in range(nproc):
                line = launcher.stdout.readline()  # type: ignore[union-attr]
                assert line.startswith("rank "), line
                started |= {int(pid) for pid in line.split()[1:]}  # the rank and its parent (launcher or agent)
        started -= {launcher.pid for launcher in launchers.values()}
        assert len(started) == 4  # 1 + 2 ranks and the agent
    finally:
        for launcher in launchers.values():
            launcher.kill()
            launcher.wait()
    deadline = time.monotonic() + 40  # the agent's own shutdown may wait for its ranks
    while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [pid for pid in started if _alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "processes outlived their SIGKILLed launcher"
