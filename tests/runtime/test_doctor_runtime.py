"""``tpu-agent doctor``: versions, backend and why, chip and eager mode, as text and as JSON."""

from __future__ import annotations

import importlib.metadata
import json

from runtime_launch_util import flat, tpu_agent_in_process


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def test_doctor_json_reports_versions_backend_chip_and_eager_mode() -> None:
    result = tpu_agent_in_process("doctor", "--format", "json", TORCH_TPU_DEFER_AND_FUSE="1", TPU_AGENT_CHIP="v7")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["versions"]["torch"] == importlib.metadata.version("torch")
    assert report["versions"]["jax"] == importlib.metadata.version("jax")
    assert report["versions"]["torch_tpu"] == "not installed"
    assert report["versions"]["libtpu"] == _installed_version("libtpu")
    assert report["backend"] == {
        "name": "emulated",
        "reason": "torch_tpu is not installed; using the CPU emulation of the 'tpu' device",
    }
    assert report["tpu_devices"] == []
    assert report["chip"] == "v7" and report["chip_source"] == "TPU_AGENT_CHIP=v7"
    assert report["eager_mode"] == {
        "name": "DEFER_AND_FUSE",
        "doc_name": "Fused Eager",
        "source": "TORCH_TPU_DEFER_AND_FUSE=1",
    }
    assert report["env"]["TORCH_TPU_DEFER_AND_FUSE"] == "1"


def test_doctor_text_and_launch_blocking_precedence() -> None:
    result = tpu_agent_in_process("doctor", TORCH_TPU_DEFER_AND_FUSE="1", TORCH_TPU_LAUNCH_BLOCKING="1")
    assert result.exit_code == 0, result.stderr
    text = flat(result.stdout)
    assert "backend emulated: torch_tpu is not installed" in text
    assert "DEFER_NEVER_AND_LAUNCH_BLOCKING / Debug Eager (TORCH_TPU_LAUNCH_BLOCKING=1)" in text
    assert "chip v6e" in text
    bad = tpu_agent_in_process("doctor", "--format", "sarif")
    assert bad.exit_code == 2 and "text or json" in flat(bad.stderr)


def test_the_guides_older_launch_blocking_name_selects_debug_eager() -> None:
    from tpu_agent.runtime.envvars import eager_mode_from_env

    mode, source = eager_mode_from_env({"TPU_LAUNCH_BLOCKING": "1"})  # eager_mode.py's spelling
    assert (mode.enum_name, source) == ("DEFER_NEVER_AND_LAUNCH_BLOCKING", "TPU_LAUNCH_BLOCKING=1")
