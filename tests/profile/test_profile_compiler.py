"""``tpu-agent profile --compiler xla``: the captured DeferAndFuse graphs run through XLA, and the profile sees
what it sees op by op (the seeded host read at its line) plus what TorchTPU's would: compiles in the warm-up and a
measured window served from the executable cache."""

from __future__ import annotations

import pytest
from profile_helpers import SCRIPTS, Captures, seed_line
from typer.testing import CliRunner

from tpu_agent.cli import app
from tpu_agent.profile.layout import raw_dir
from tpu_agent.runtime import events
from tpu_agent.runtime.xla.settings import COMPILER_ENV


@pytest.mark.slow  # a real capture, its step graphs compiled by XLA
def test_profile_runs_the_graphs_through_the_chosen_compiler(captures: Captures) -> None:
    logdir, report, result = captures.get("host_sync.py", "--eager-mode", "defer-and-fuse", "--compiler", "xla")
    assert report["capture"]["exit_code"] == 0, result.stderr[-3000:]
    seeded = (str(SCRIPTS / "host_sync.py"), seed_line(SCRIPTS / "host_sync.py", "HS-1"))
    places = {
        (loc["file"], loc["line"]) for f in report["findings"] if f["rule_id"] == "HS-1" for loc in f["locations"]
    }
    assert seeded in places, report["findings"]

    log = events.read_events(raw_dir(logdir))[0]
    (run_info,) = events.iter_kind(log, events.RunInfo)
    assert isinstance(run_info, events.RunInfo) and run_info.env[COMPILER_ENV] == "xla"
    kinds = [type(event).__name__ for event in log if isinstance(event, events.Compile | events.CacheHit)]
    # each step's graph (cut by its loss.item()) compiles in the warm-up; the 5 measured steps reuse it
    assert "Compile" in kinds and kinds[-5:] == ["CacheHit"] * 5, kinds


def test_an_unknown_compiler_is_refused_before_anything_runs() -> None:
    refused = CliRunner().invoke(app, ["profile", "--compiler", "tvm", "train.py"])
    assert refused.exit_code == 2 and "--compiler" in refused.output and "'tvm' is not one of" in refused.output
