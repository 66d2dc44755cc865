"""Cost of ``tpu-agent profile`` against a plain ``tpu-agent run``, and analysis time of a long capture.

1. Overhead: the bundled example (``examples/cuda_ddp``) is copied to a temporary directory and migrated
   with ``tpu_agent.migrate`` (if the migrated copy does not run yet, the original copy is measured and the
   script says so); then ``tpu-agent run train.py`` and ``tpu-agent profile train.py`` run in
   alternation (fresh processes, same arguments), and the ratio of the median wall times is printed.
   The profiled run includes everything a user waits for: capture, XSpace, rules, reports. Printed: the
   best (least disturbed) of the alternated runs, in wall seconds and in CPU seconds. Target: <= 1.10x.
   On a loaded host read the CPU-seconds line: wall time then mostly measures the other processes.
   The profiled run is profile's default; ``--compiler-pass`` also times ``profile --tpu-compiler`` (the
   step compiled for the TPU as ``tpu-agent estimate`` does: a second, short run of the script and a libtpu
   compile, an estimate rather than profiling) in the same alternation, and prints its ratio beside the
   target's (it has no target of its own). Diff verification is off here (``--no-verify``): it is one more run of
   the script per diff, an opt-out check rather than capture overhead; ``benchmarks/profile_verify_bench.py`` prints,
   per seeded case, the profile's overhead over a plain run beside the seconds verification adds.
2. Analysis: a synthetic capture of 1,000 steps (``tpu_agent.profile.synthetic``, the on-disk format of a
   real capture) is diagnosed in-process (load, every rule, estimate, XSpace, json/md/html reports).
   Target: < 10 s.

    python benchmarks/profile_bench.py [--repeats 5] [--train-steps 60] [--profile-steps 10] [--compiler-pass]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OVERHEAD_TARGET = 1.10
ANALYSIS_TARGET_S = 10.0


CLI = [sys.executable, "-m", "tpu_agent"]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(command: list[str], cwd: Path) -> tuple[tuple[float, float], subprocess.CompletedProcess[str]]:
    """Wall seconds and CPU seconds (user + system of the process tree) of one command."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cpu = _children_cpu_s()
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    return (time.perf_counter() - start, _children_cpu_s() - cpu), result


def example_project(workdir: Path, script: list[str]) -> tuple[Path, str]:
    """A migrated copy of the bundled CUDA example; the unmigrated copy (CPU tensors under the runtime) if the
    migrated one does not run, so that the overhead is still measured on the same training loop."""
    from tpu_agent.migrate.api import apply, plan

    migrated = workdir / "migrated" / "cuda_ddp"
    shutil.copytree(REPO / "examples" / "cuda_ddp", migrated)
    apply(plan([migrated]), allow_dirty=True)
    _, result = _run([*CLI, "run", *script], migrated)
    if result.returncode == 0:
        return migrated, "migrated"
    original = workdir / "original" / "cuda_ddp"
    shutil.copytree(REPO / "examples" / "cuda_ddp", original)
    last = (result.stderr.strip().splitlines() or ["?"])[-1]
    print(f"  the migrated example fails under `tpu-agent run` ({last}); measuring the original, unmigrated copy")
    return original, "original"


def timed(command: list[str], cwd: Path) -> tuple[float, float]:
    elapsed, result = _run(command, cwd)
    if result.returncode != 0 and not (command[len(CLI)] == "profile" and '"exit_code": 0' in result.stdout):
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return elapsed


def _profile_command(logdir: Path, profile_steps: int, script: list[str], compiler: bool) -> list[str]:
    return [
        *CLI,
        "profile",
        "--logdir",
        str(logdir),
        "--steps",
        str(profile_steps),
        "--warmup",
        "2",
        "--format",
        "json",
        "--tpu-compiler" if compiler else "--no-tpu-compiler",
        # The capture's own cost: checking each diff is one more run of the script per diff, measured per case by
        # benchmarks/profile_verify_bench.py.
        "--no-verify",
        *script,
    ]


def overhead(
    repeats: int, train_steps: int, profile_steps: int, compiler_pass: bool
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per variant ("profile", and "profile + TPU compiler" when asked) and measure (wall, cpu): best plain
    seconds, best profiled seconds, and the median of the ratios of back-to-back (plain, profiled) pairs. On a
    shared host both views are printed: the minimum is the least disturbed run, the paired ratio cancels slow
    drifts in load.
    """
    variants = {"profile": False, **({"profile + TPU compiler": True} if compiler_pass else {})}
    with tempfile.TemporaryDirectory(prefix="profile-bench-") as tmp:
        script = ["train.py", "--steps", str(train_steps)]
        project, which = example_project(Path(tmp), script)
        print(f"  project: {which} copy of examples/cuda_ddp")
        plain: list[tuple[float, float]] = []
        profiled: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        for index in range(repeats):
            plain.append(timed([*CLI, "run", *script], project))
            line = f"  run {index + 1}: plain {plain[-1][0]:.2f} s wall / {plain[-1][1]:.2f} s cpu"
            for name, compiler in variants.items():
                logdir = Path(tmp) / f"logs-{index}-{compiler}"
                profiled[name].append(timed(_profile_command(logdir, profile_steps, script, compiler), project))
                line += f", {name} {profiled[name][-1][0]:.2f} s wall / {profiled[name][-1][1]:.2f} s cpu"
            print(line, flush=True)
        return {
            name: {
                measure: (
                    min(p[i] for p in plain),
                    min(p[i] for p in runs),
                    statistics.median(b[i] / a[i] for a, b in zip(plain, runs, strict=True)),
                )
                for i, measure in enumerate(("wall", "cpu"))
            }
            for name, runs in profiled.items()
        }


def analysis(steps: int) -> tuple[float, float, int]:
    from tpu_agent.profile.api import diagnose
    from tpu_agent.profile.synthetic import write_capture

    with tempfile.TemporaryDirectory(prefix="profile-bench-") as tmp:
        start = time.perf_counter()
        write_capture(Path(tmp), steps=steps)
        written = time.perf_counter()
        diagnosis = diagnose(Path(tmp))
        done = time.perf_counter()
        return written - start, done - written, len(diagnosis.findings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--analysis-steps", type=int, default=1000)
    parser.add_argument("--compiler-pass", action="store_true", help="also time profile --tpu-compiler (needs libtpu)")
    args = parser.parse_args()

    print(
        f"overhead: examples/cuda_ddp, train.py --steps {args.train_steps}, profile --steps {args.profile_steps} "
        "--warmup 2"
    )
    results = overhead(args.repeats, args.train_steps, args.profile_steps, args.compiler_pass)
    for name, measures in results.items():
        for measure, (plain, profiled, paired) in measures.items():
            ratio = profiled / plain
            verdict = (
                ("OK" if max(ratio, paired) <= OVERHEAD_TARGET else "OVER TARGET")
                if name == "profile"
                else "(an estimate, not profiling: no target)"
            )
            print(
                f"  {name}, {measure}: best plain {plain:.2f} s, best profiled {profiled:.2f} s: ratio {ratio:.3f}x; "
                f"median paired ratio {paired:.3f}x (target <= {OVERHEAD_TARGET}x) {verdict}"
            )

    write_s, analyse_s, findings = analysis(args.analysis_steps)
    verdict = "OK" if analyse_s < ANALYSIS_TARGET_S else "OVER TARGET"
    print(
        f"analysis: synthetic capture of {args.analysis_steps} steps written in {write_s:.2f} s, diagnosed in "
        f"{analyse_s:.2f} s "
        f"({findings} findings; target < {ANALYSIS_TARGET_S:.0f} s) {verdict}"
    )


if __name__ == "__main__":
    main()
