"""Verified diffs over the seeded suite: per case, the finding, its line, the diff's verdict, and, side by side, what
profiling costs over a plain run and what verification adds over profiling.

Each case is one script of ``tests/profile/scripts`` run once with ``tpu-agent run`` and profiled once with ``--verify``
(every diff its findings offer is checked on a copy). Printed per case: the plain run's seconds, the capture's
seconds (the profile without its verification) and their ratio (the profile overhead), the seconds verification added
and its ratio to the capture, then the rule expected, whether it was found at the seeded line (``# SEED: <rule>``),
the verdict of its diff (verified with the measure before and after, withheld with the reason, or advice in words
with the reason there is no diff). A last line sums the sweep. Ratios, not timed asserts: the sweep fails (exit 1)
only when a finding offers a diff that is not verified, or the tuned script gets a warning.

    python benchmarks/profile_verify_bench.py [--only host_sync.py ...] [--steps 5] [--warmup 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "profile" / "scripts"


@dataclass(frozen=True)
class Case:
    """A seeded script, the CLI options it needs, and the rules (with their seed markers) it must show."""

    script: str
    rules: tuple[tuple[str, str], ...]  # (rule id, seed marker)
    options: tuple[str, ...] = ()


CASES = (
    Case("host_sync.py", (("HS-1", "HS-1"),)),
    Case("classifier_syncs.py", (("HS-2", "HS-2"), ("HS-2", "HS-2b"), ("HS-1", "HS-1"))),
    Case("lm_python_length.py", (("SH-1", "SH-1"),)),
    Case("loader_last_batch.py", (("SH-1", "SH-1"),)),
    Case("collate_pad_sequence.py", (("SH-1", "SH-1"),)),
    Case("dynamic_shapes.py", (("SH-1", "CREATED: SH-1"),)),
    Case("recompile.py", (("CO-1", "CREATED: CO-1"),)),
    Case("recompile_scalars.py", (("CO-1", "CO-1"),)),
    Case("issue_churn.py", (("CO-1", "CO-1"), ("SH-1", "CO-1"))),
    Case("fp32_odd_dims.py", (("PR-1", "PR-1"), ("SH-2", "SH-2"))),
    Case("slow_loader.py", (("IP-1", "IP-1"),)),
    Case("graph_break.py", (("CO-2", "CO-2"),)),
    Case("strict_eager.py", (("EM-1", "EM-1"),), ("--eager-mode", "strict")),
    Case("host_sync.py", (("HS-1", "HS-1"),), ("--eager-mode", "defer-and-fuse")),  # the read that cuts the graph
    Case("memory_fit.py", (("SD-1", "SD-1"),), ("--chip", "v5e")),
    Case("memory_growth.py", (("SD-8", "SD-8"),)),
    Case("two_ranks.py", (("SD-2", "SD-2"),), ("--nproc", "2")),
    Case("finetune_unfreeze.py", (("CO-1", "CO-1"),)),
    Case("fused_accumulation_reads.py", (("EM-2", "EM-2"), ("HS-1", "EM-2"))),
    Case("well_tuned.py", ()),
)


def _seed_line(script: Path, marker: str) -> int | None:
    for number, text in enumerate(script.read_text(encoding="utf-8").splitlines(), start=1):
        if f"# SEED: {marker}" in text or (marker.startswith("CREATED") and f"{marker}" in text):
            return number
    return None


def _verdict(finding: dict[str, Any]) -> str:
    change = finding.get("agent_change") or {}
    checked = change.get("verification") or {}
    if change.get("diff") and change.get("verified"):
        return f"verified ({checked['metric']} {checked['before']:g} -> {checked['after']:g})"
    if change.get("diff"):
        return f"UNVERIFIED DIFF ({checked.get('reason', 'no verification')})"
    if checked:
        return f"withheld: {checked['reason']}"
    if change.get("no_diff_reason"):
        return f"advice in words: {change['no_diff_reason']}"
    return "advice only (the rule has no diff for it)"


def plain_run_s(case: Case, env: dict[str, str]) -> float | None:
    """Wall seconds of ``tpu-agent run`` of the case with its run options (``None`` when it fails)."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tpu_agent", "run", *case.options, str(SCRIPTS / case.script)],
        capture_output=True, text=True, env=env, timeout=1800, cwd=REPO,
    )  # fmt: skip
    return time.monotonic() - started if result.returncode == 0 else None


def run_case(case: Case, steps: int, warmup: int) -> dict[str, Any]:
    """Run the case once plainly, then profile it once with --verify and read its findings."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TPU_AGENT_PROFILE_VERIFY": "1"}
    plain = plain_run_s(case, env)
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, "-m", "tpu_agent", "profile", "--verify", "--logdir", f"{scratch}/log"]
        command += ["--steps", str(steps), "--warmup", str(warmup), "--format", "json", *case.options]
        started = time.monotonic()
        result = subprocess.run(
            [*command, str(SCRIPTS / case.script)], capture_output=True, text=True, env=env, timeout=1800, cwd=REPO
        )
        wall = time.monotonic() - started
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        return {"case": case.script, "error": result.stderr[-800:]}
    verification = report.get("verification") or {}
    rows = []
    for rule_id, marker in case.rules:
        line = _seed_line(SCRIPTS / case.script, marker)
        found = [f for f in report["findings"] if f["rule_id"] == rule_id]
        at_line = [f for f in found if any(loc["line"] == line for loc in f["locations"])]
        finding = (at_line or found or [None])[0]
        rows.append(
            {
                "rule": rule_id,
                "seed_line": line,
                "found": finding is not None,
                "at_line": bool(at_line),
                "lines": [loc["line"] for loc in finding["locations"]] if finding else [],
                "verdict": _verdict(finding) if finding else "NOT FOUND",
            }
        )
    unverified = [
        f["rule_id"]
        for f in report["findings"]
        if (f.get("agent_change") or {}).get("diff") and not f["agent_change"]["verified"]
    ]
    warnings = [f["rule_id"] for f in report["findings"] if f["severity"] in ("error", "warning")]
    return {
        "case": case.script + (" " + " ".join(case.options) if case.options else ""),
        "rows": rows,
        "all_findings": {f["rule_id"]: _verdict(f) for f in report["findings"]},
        "unverified_diffs": unverified,
        "warnings": warnings,
        "wall_s": round(wall, 1),
        "run_s": round(plain, 1) if plain is not None else None,
        "verify_s": verification.get("seconds", 0.0),
        "diffs": verification.get("diffs", 0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None, help="Scripts to run (default: every case).")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="Also write the results here.")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only is None or c.script in args.only]
    results, failed = [], False
    totals = dict.fromkeys(("run", "capture", "verify", "profiled", "diffs"), 0.0)
    for case in cases:
        result = run_case(case, args.steps, args.warmup)
        results.append(result)
        if "error" in result:
            print(f"{result['case']}: profile failed: {result['error']}")
            failed = True
            continue
        capture_s = result["wall_s"] - result["verify_s"]
        totals["run"] += result["run_s"] or 0.0
        totals["capture"] += capture_s if result["run_s"] else 0.0
        totals["verify"] += result["verify_s"]
        totals["profiled"] += capture_s
        totals["diffs"] += result["diffs"]
        overhead = f"{capture_s / result['run_s']:.2f}x" if result["run_s"] else "n/a (the plain run failed)"
        per_diff = f", {result['verify_s'] / result['diffs']:.1f} s a diff" if result["diffs"] else ""
        print(
            f"{result['case']}: run {result['run_s'] or 0:.1f} s | profile {capture_s:.1f} s ({overhead} the run) | "
            f"verification +{result['verify_s']:.1f} s ({result['verify_s'] / capture_s:.2f}x the capture) "
            f"for {result['diffs']} diff(s){per_diff}"
        )
        for row in result["rows"]:
            where = "at the seeded line" if row["at_line"] else f"lines {row['lines']} (seeded {row['seed_line']})"
            print(f"  {row['rule']}: {where}: {row['verdict']}")
        others = {k: v for k, v in result["all_findings"].items() if k not in {r["rule"] for r in result["rows"]}}
        for rule_id, verdict in others.items():
            print(f"  (also {rule_id}: {verdict})")
        if result["unverified_diffs"] or (not case.rules and result["warnings"]):
            failed = True
            print(f"  FAIL: unverified diffs {result['unverified_diffs']}, warnings {result['warnings']}")
    if totals["run"] and totals["profiled"]:
        print(
            f"sweep: profile {totals['capture'] / totals['run']:.2f}x a plain run (sum over the cases that ran plainly); "
            f"verification adds {totals['verify'] / totals['profiled']:.2f}x the captures' time, "
            f"{totals['verify']:.0f} s for {totals['diffs']:.0f} diffs"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
