"""The calibrated step time: one factor with its band, from published TPU runs, applied by one function."""

from __future__ import annotations

import pytest

from tpu_agent.estimate import calibration
from tpu_agent.estimate.calibration import PUBLISHED_RUNS, PublishedRun, calibrated_time, calibration_from_runs
from tpu_agent.estimate.hlo import summarize
from tpu_agent.estimate.model import CompiledEstimate, HbmBreakdown, ProgramEstimate
from tpu_agent.estimate.options import EFFORTS
from tpu_agent.estimate.report import summary_rows


def _run(measured: float, estimated: float, effort: str = "fast") -> PublishedRun:
    return PublishedRun(
        f"run {measured}", "https://example.org", "v6e-8", (), "ran", measured, None, {effort: estimated}
    )


def test_the_factor_is_the_geometric_mean_of_measured_over_estimated_and_the_band_their_spread() -> None:
    oom = PublishedRun("oom", "", "v6e-4", (), "x")
    found = calibration_from_runs("kind", (_run(4.0, 1.0), _run(9.0, 1.0), oom), "fast")
    assert found is not None
    assert found.factor == pytest.approx(6.0) and (found.low, found.high) == (4.0, 9.0)
    assert found.runs == ("run 4.0", "run 9.0")  # the refused run has no time and is not in the factor
    assert calibration_from_runs("kind", (oom,), "fast") is None
    zero = PublishedRun("no time", "", "v6e-8", (), "ran", measured_seconds=2.0, estimated_seconds={"fast": -1.0})
    assert calibration_from_runs("kind", (_run(4.0, 1.0), zero), "fast").runs == ("run 4.0",)  # named if in it
    # each compile effort times programs its own way: a run estimated at one effort does not calibrate the other
    assert calibration_from_runs("kind", (_run(4.0, 1.0, "full"),), "fast") is None


def test_the_published_runs_cite_their_sources_and_a_run_without_an_estimate_gives_no_factor() -> None:
    assert all(run.source.startswith("https://") for run in PUBLISHED_RUNS)
    for effort in EFFORTS:
        expected = calibration_from_runs(
            f"{calibration.CALIBRATION_KIND}, compiled at {effort} effort", PUBLISHED_RUNS, effort
        )
        assert calibration.CALIBRATIONS[effort] == expected
        if not any(effort in run.estimated_seconds for run in PUBLISHED_RUNS):
            assert calibrated_time(1.0, 1e12, 8, 918e12, effort) is None  # no calibration: no calibrated time


def _estimate(seconds: float, fits: bool = True) -> CompiledEstimate:
    memory = HbmBreakdown(1, 0, 0, 0, 0, 0 if fits else 2**40, 0)
    program = ProgramEstimate("step", 1e12, 0.0, 0.0, seconds, memory, summarize(""))
    return CompiledEstimate("v6e-8", "TPU v6e", 8, "fsdp", "fast", 2**35, 918e12, [program], model_flops_per_step=8e12)


def test_the_report_and_json_carry_the_calibrated_time_band_source_and_mfu(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = (_run(4.0, 1.0), _run(9.0, 1.0))
    found = calibration_from_runs("kind", runs, "fast")
    assert found is not None
    monkeypatch.setattr(calibration, "CALIBRATIONS", {"fast": found})  # the table's data, as the benchmark fills it
    monkeypatch.setattr(calibration, "PUBLISHED_RUNS", runs)
    estimate = _estimate(1.0)
    calibrated = estimate.to_dict()["calibrated"]
    assert calibrated["seconds"] == pytest.approx(found.factor)
    assert (calibrated["low_seconds"], calibrated["high_seconds"]) == pytest.approx((found.low, found.high))
    assert calibrated["mfu"] == pytest.approx(8e12 / (found.factor * 918e12 * 8))
    assert calibrated == calibrated_time(1.0, 8e12, 8, 918e12, "fast")
    row = dict(summary_rows(estimate))["step time (calibrated)"]
    assert "https://example.org" in row and f"x{found.factor:.2f}" in row and "eager modes" in row
    assert _estimate(1.0, fits=False).to_dict()["calibrated"] is None  # no time for a step that cannot run
    full = _estimate(1.0)
    full.effort = "full"
    assert full.to_dict()["calibrated"] is None and full.to_dict()["effort"] == "full"  # not calibrated at full
