"""``torch.compile`` under DeferAndFuse with ``--compiler xla`` (nanoGPT's and build-nanogpt's flow): Dynamo and
AOTAutograd trace the model on tpu tensors over fake and functional data, which DeferAndFuse must never record
into (or flush from) its pending graph. Runs the real CLI in a fresh process; Strict mode is the reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from runtime_launch_util import SCRIPTS, clean_env, tpu_agent


@pytest.mark.slow
def test_a_compiled_model_trains_and_evaluates_in_defer_and_fuse_as_in_strict_mode(tmp_path: Path) -> None:
    proc = tpu_agent(
        "run", "--compiler", "xla", str(SCRIPTS / "xla_compile_deferred.py"),
        cwd=SCRIPTS, env=clean_env(TPU_AGENT_EVENTS_DIR=str(tmp_path)), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    strict, fused = out["DEFER_NEVER"], out["DEFER_AND_FUSE"]
    # the whole model ran as XLA executables in both modes: forward and backward while training, and the
    # no_grad evaluation's inference graph; nothing fell back to running op by op
    graphs = ["forward [xla backward]", "forward [xla forward]", "forward [xla inference]"]
    assert strict["xla_graphs"] == fused["xla_graphs"] == graphs, out
    assert strict["fallbacks"] == fused["fallbacks"] == [], out
    # the same executables on the same data: the same losses (op-by-op bf16 moved them by about 1e-4)
    np.testing.assert_allclose(fused["losses"], strict["losses"], rtol=1e-6)
    np.testing.assert_allclose(fused["evaluations"], strict["evaluations"], rtol=1e-6)
