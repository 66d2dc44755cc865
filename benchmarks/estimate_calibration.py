"""The estimate against published TPU runs: each run of ``tpu_agent.estimate.calibration.PUBLISHED_RUNS`` is
captured here on meta storage (``tpu-agent estimate --capture-only``, a user-style PyTorch script with the run's
model, per-chip batch and sequence) and compiled for its slice; printed per run: the compiler's step time
(uncalibrated), the measured time and their ratio, the calibrated time and its band, and the verdict against
what the hardware did (ran, or refused at compile time for want of HBM). The ratios printed are what the
calibration table's ``estimated_seconds`` hold, per effort. Needs libtpu; each 8B capture takes minutes on two cores.

    python benchmarks/estimate_calibration.py [--only v6e-8] [--effort fast|full] [--timeout 3600] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tpu_agent.estimate.calibration import PUBLISHED_RUNS, PublishedRun  # noqa: E402
from tpu_agent.estimate.options import DEFAULT_EFFORT, EFFORTS  # noqa: E402

SCRIPT = REPO / "tests" / "estimate" / "scripts" / "llama_fsdp_train.py"


def estimate(run: PublishedRun, timeout: float, effort: str) -> tuple[dict[str, Any], float, int]:
    """The estimate document for one published run, the wall time and the peak RSS of the run's processes."""
    command = [
        sys.executable, "-m", "tpu_agent", "estimate", "--chip", run.target, "--strategy", "fsdp", "--capture-only",
        "--no-suggest", "--effort", effort, "--format", "json", str(SCRIPT), *run.script_args,
    ]  # fmt: skip
    start = time.perf_counter()
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=timeout
    )
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    try:
        document = json.loads(result.stdout)
    except json.JSONDecodeError:
        document = {"error": {"message": result.stderr[-2000:]}}
    return document, seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run only the published runs on this target (v6e-8)")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--effort", choices=EFFORTS, default=DEFAULT_EFFORT, help="the compiler's effort to time at")
    parser.add_argument("--out", type=Path, help="also write the per-run figures here as JSON")
    args = parser.parse_args()
    rows = []
    for run in PUBLISHED_RUNS:
        if args.only and run.target != args.only:
            continue
        document, seconds, peak = estimate(run, args.timeout, args.effort)
        found = document.get("estimate")
        row: dict[str, Any] = {"run": run.name, "target": run.target, "source": run.source, "outcome": run.outcome}
        row.update(wall_seconds=round(seconds, 1), peak_rss_gib=round(peak / 2**30, 2))
        if found is None:
            row["error"] = document.get("error")
        else:
            row.update(verdict=found["verdict"], estimated_seconds=found["step_seconds"])
            row["peak_hbm_gib"] = round(found["peak_hbm_bytes_per_chip"] / 2**30, 2)
            row["largest_memory_gib"] = {
                item["kind"]: round(item["bytes"] / 2**30, 2) for item in found["largest_memory"]
            }
            # a program the compiler refused has no time: a step time without it is not the step's
            row["refused_programs"] = [program["name"] for program in found["programs"] if program["refused"]]
            row["calibrated"] = found.get("calibrated")
            expected = "fits" if run.outcome == "ran" else "does not fit"
            row["verdict_matches_hardware"] = found["verdict"] == expected
            if run.measured_seconds and found["step_seconds"] > 0 and not row["refused_programs"]:
                row["measured_over_estimated"] = run.measured_seconds / found["step_seconds"]
                if found.get("calibrated"):
                    row["calibrated_over_measured"] = found["calibrated"]["seconds"] / run.measured_seconds
        rows.append(row)
        print(json.dumps(row, indent=2), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
