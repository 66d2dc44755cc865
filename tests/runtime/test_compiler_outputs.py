"""What a run that compiles nothing says about the compiler outputs it was asked for (tpu_agent.runtime.xla.outputs):
HLO dumps (XLA_FLAGS --xla_dump_to) and TorchTPU's tier-2 cache (TORCH_TPU_TIER2_COMPILATION_CACHE)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tpu_agent.errors import TpuAgentError
from tpu_agent.runtime.envvars import TIER2_CACHE_ENV
from tpu_agent.runtime.xla import outputs


def test_the_dump_directory_and_the_tier2_folder_are_read_as_torchtpu_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert outputs.hlo_dump_directory("--xla_dump_hlo_as_text --xla_dump_to=/tmp/a --xla_dump_to=/tmp/b") == "/tmp/b"
    assert outputs.hlo_dump_directory("--xla_dump_hlo_as_text") is None
    assert outputs.hlo_dump_directory("--xla_dump_to=/tmp/bob's") == "/tmp/bob's"  # shlex would refuse the quote
    monkeypatch.delenv(outputs.TIER2_ROOT_ENV, raising=False)
    monkeypatch.setenv(TIER2_CACHE_ENV, "disabled")
    assert outputs.tier2_directory() is None
    monkeypatch.setenv(TIER2_CACHE_ENV, "default")
    assert outputs.tier2_directory() == Path("/dev/shm/torch_tpu_cache/default")
    monkeypatch.setenv(outputs.TIER2_ROOT_ENV, str(tmp_path))
    assert outputs.tier2_directory() == tmp_path / "default"
    monkeypatch.setenv(TIER2_CACHE_ENV, "/tmp/cache")
    with pytest.raises(TpuAgentError, match="not a cache name"):
        outputs.tier2_directory()


def test_without_xla_the_run_says_once_that_nothing_is_written_and_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(TIER2_CACHE_ENV, raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert outputs.explain_without_xla() is None  # nothing asked for, nothing said
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_hlo_as_text --xla_dump_to=/tmp/hlo")
    monkeypatch.setenv(TIER2_CACHE_ENV, "mine")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "tpu_agent.runtime.bootstrap", "train.py"])
    statement = outputs.explain_without_xla()
    assert statement is not None and capsys.readouterr().err == statement + "\n"
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "worker.py"])  # a process rank 0 started: RANK inherited
    assert outputs.explain_without_xla() == statement and capsys.readouterr().err == ""
    assert "HLO dumps in /tmp/hlo" in statement and "torch_tpu_cache/mine" in statement
    assert "--compiler xla" in statement and "_get_cache_stats" in statement
