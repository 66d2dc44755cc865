"""Hugging Face architecture coverage of the ``tpu`` device: ``tpu-agent check`` over every architecture
transformers can build offline, written to docs/model-coverage.md.

The selection is architecture-balanced, as TorchTPU's own validation pipeline is: one representative per model
class in transformers' causal-LM, masked-LM, seq2seq and image-classification auto mappings, each built from a
tiny config derived from its config class (random weights, no download). Every architecture runs forward +
backward on CPU and on ``tpu`` in Strict, DeferAndFuse and ``torch.compile(backend="tpu")`` at matmul precision
"highest", through :func:`tpu_agent.check.check_model`, in parallel worker processes with a per-model timeout.
``torch.compile`` costs tens of seconds per model on CPU, so by default it is checked on every 4th architecture
of the mappings (``--compile-every``), the same sample whatever subset is selected.

An architecture whose tiny model does not build or run on plain CPU says nothing about the device: it is
listed, and left out of the pass rates.

Target (issue 10): >= 98% of the CPU-runnable architectures pass in Strict and in DeferAndFuse, no mismatch.

    python benchmarks/hf_coverage.py [--jobs 2] [--timeout 300] [--limit 20] [--stride 5] [--only llama,bert]
        [--modes strict,defer-and-fuse,compile] [--compile-every 4] [--timing] [--output docs/model-coverage.md]
        [--json out.json] [--resume] [--isolated] [--max-memory-mb 6000]
    python benchmarks/hf_coverage.py --merge eager.json compile.json --note "..."   # one page from several runs
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpu_agent.check import MODES, CheckOptions, CheckReport, ModelSpec, check_model
from tpu_agent.check.pool import ServingWorker
from tpu_agent.check.spec import HF_TYPE
from tpu_agent.check.tiny import TASK_MAPPINGS, model_class_name
from tpu_agent.errors import TpuAgentError
from tpu_agent.fsutil import atomic_write_text

SWEPT_TASKS = ("causal-lm", "masked-lm", "seq2seq", "image-classification")
NOT_ON_CPU = "not on cpu"  # the tiny model does not build or run on plain CPU
TARGET = 0.98


@dataclass(frozen=True)
class Case:
    model_type: str
    task: str
    class_name: str


def architectures() -> list[Case]:
    """One case per model class, in mapping order; a class reachable from several types is kept once."""
    from transformers.models.auto import modeling_auto

    seen: set[str] = set()
    cases = []
    for task in SWEPT_TASKS:
        for model_type in getattr(modeling_auto, TASK_MAPPINGS[task]):
            class_name = model_class_name(model_type, task)
            if class_name is not None and class_name not in seen:
                seen.add(class_name)
                cases.append(Case(model_type, task, class_name))
    return cases


def verdict(mode: dict[str, Any]) -> str:
    """``pass`` / ``mismatch`` / ``error``, or :data:`NOT_ON_CPU` when the failure was before the device."""
    error = mode.get("error")
    if error and error["stage"] in ("build", "cpu"):
        return NOT_ON_CPU
    return mode["status"]


def cause(mode: dict[str, Any]) -> str:
    """A failure's cause with the instance details (numbers, names in quotes, shapes) taken out, for grouping."""
    error = mode.get("error")
    if error:
        text = f"{error['type']}: {error['message'].splitlines()[0] if error['message'] else ''}"
    elif mode.get("localisation") and mode["localisation"].get("op"):
        text = f"mismatch at {mode['localisation']['op']} ({mode['localisation']['kind']})"
    elif mode.get("localisation"):
        text = f"mismatch in a {mode['localisation']['module_type']} ({mode['localisation']['kind']})"
    else:
        text = "mismatch (not localised)"
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text)
    return text[:160]


def _as_result(
    case: Case, report: CheckReport | None, error: TpuAgentError | None, modes: tuple[str, ...]
) -> dict[str, Any]:
    if report is not None:
        data = report.to_dict()
    else:  # transformers lacks something for this type: counts as not buildable
        assert error is not None
        data = {
            "modes": [
                {
                    "mode": m,
                    "status": "error",
                    "error": {"stage": "build", "type": "TpuAgentError", "message": error.message, "location": ""},
                }
                for m in modes
            ]
        }
    data["case"] = case.__dict__
    return data


def case_modes(case: Case, modes: tuple[str, ...], compiled_sample: set[str]) -> tuple[str, ...]:
    """The modes ``case`` is checked in: all of ``modes``, less ``compile`` outside the compile sample."""
    return tuple(m for m in modes if m != "compile" or case.class_name in compiled_sample)


def compile_sample(every: list[Case], step: int) -> set[str]:
    """Every ``step``-th architecture of the whole mapping (not of a selection, so that a subset re-run checks
    compile on the same architectures as the full run did)."""
    return {case.class_name for case in every[:: max(1, step)]}


def run_case(
    case: Case, options: CheckOptions, worker: ServingWorker | None = None, modes: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """Check one architecture in ``modes`` (default: the options'): in ``worker`` (a serving process shared with
    other models) when given, else in fresh processes per mode (:func:`check_model`)."""
    started = time.perf_counter()
    spec = ModelSpec(HF_TYPE, case.model_type, case.task)
    modes = modes or options.modes
    try:
        report = worker.check(spec, modes) if worker is not None else check_model(spec, replace(options, modes=modes))
        data = _as_result(case, report, None, modes)
    except TpuAgentError as error:
        data = _as_result(case, None, error, modes)
    data["wall_s"] = round(time.perf_counter() - started, 1)
    return data


def failed_on_device(result: dict[str, Any]) -> bool:
    return any(verdict(m) in ("mismatch", "error") for m in result["modes"])


def confirm_in_isolation(result: dict[str, Any], options: CheckOptions) -> dict[str, Any]:
    """Re-check a failure found in a shared serving process with one fresh process per mode; the isolated
    verdict is the one reported (a failure that only the shared process showed is counted separately)."""
    case = Case(**result["case"])
    modes = tuple(m["mode"] for m in result["modes"])
    isolated = run_case(case, replace(options, process_per_mode=True), modes=modes)
    isolated["wall_s"] = round(isolated["wall_s"] + result["wall_s"], 1)
    isolated["confirmed_in_isolation"] = True
    isolated["shared_process_failures"] = {
        m["mode"]: cause(m) for m in result["modes"] if verdict(m) in ("mismatch", "error")
    }
    return isolated


def _rate(count: int, total: int) -> str:
    return f"{count / total:.1%}" if total else "n/a"


def render_markdown(results: list[dict[str, Any]], modes: tuple[str, ...], meta: dict[str, Any]) -> str:
    """docs/model-coverage.md: totals per mode, per task, top causes and the failing architectures."""
    lines = [
        "# Model coverage of the emulated `tpu` device",
        "",
        "Generated by `benchmarks/hf_coverage.py` (do not edit by hand; *Reproduce* at the end gives the commands).",
        "Each architecture (one model class",
        "per entry of transformers' causal-LM, masked-LM, seq2seq and image-classification auto mappings) is built",
        "from a tiny config derived from its config class, and `tpu-agent check` runs forward + backward on CPU and",
        'on `tpu` in each mode at `torch.set_float32_matmul_precision("highest")`, comparing every output and every',
        "gradient (parameters and floating inputs): per tensor, `max|tpu - cpu| <= atol + rtol * max|cpu|`, float32",
        "rtol 1e-5 / atol 1e-6, integers exact. Inputs: batch 2, sequence 8 with the second sequence's last two",
        "positions padded (so attention masks take their real path), or 2 images of the tiny configs' 64 x 64",
        "pixels. Tiny configs: 2 layers (one of each kind where a config lists kinds per layer), width 64, 4 heads,",
        "vocabulary 256, 4 experts, one block per stage; the rules are `SHRINK_RULES` in `tpu_agent/check/tiny.py`.",
        "",
        f"Run: {meta['date']}, transformers {meta['transformers']}, torch {meta['torch']}, "
        f"{len(results)} of {meta['selected']} selected architectures checked ({meta['available']} in the mappings)"
        f"{meta['subset_note']}.",
        *([meta["note"], ""] if meta.get("note") else [""]),
        "Models are checked one after another in long-lived worker processes (imports paid once per process);",
        "every failure found there is re-checked with one fresh process per mode, and that verdict is the one",
        f"reported{_recheck_summary(results)}.",
        "",
        "A model that does not build or run on plain CPU from its tiny config is listed under *not runnable on CPU*",
        "and left out of the rates: it says nothing about the device.",
        "",
        "## Summary",
        "",
        "| mode | architectures | pass | mismatch | error | not runnable on CPU | pass rate (of CPU-runnable) | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = {mode: [verdict(m) for r in results for m in r["modes"] if m["mode"] == mode] for mode in modes}
    for mode in modes:
        counts = Counter(verdicts[mode])
        runnable = counts["pass"] + counts["mismatch"] + counts["error"]
        target = f">= {TARGET:.0%}" if mode in ("strict", "defer-and-fuse") else ""
        lines.append(
            f"| {mode} | {len(verdicts[mode])} | {counts['pass']} | {counts['mismatch']} | {counts['error']} | "
            f"{counts[NOT_ON_CPU]} | {_rate(counts['pass'], runnable)} | {target} |"
        )
    sampled = [mode for mode in modes if 0 < len(verdicts[mode]) < len(results)]
    if sampled:
        lines += [
            "",
            f"{', '.join(sampled)}: checked on a sample only (every 4th architecture by default, `--compile-every`).",
        ]
    not_on_cpu = [r for r in results if all(verdict(m) == NOT_ON_CPU for m in r["modes"])]
    lines += ["", f"Not runnable on CPU from a tiny config: {len(not_on_cpu)} of {len(results)}.", ""]
    timing = _timing_lines(results, modes)
    lines += timing
    lines += ["## Per task", "", "| task | mode | pass | mismatch | error | pass rate |", "|---|---|---|---|---|---|"]
    for task in SWEPT_TASKS:
        for mode in modes:
            counts = Counter(
                verdict(m) for r in results if r["case"]["task"] == task for m in r["modes"] if m["mode"] == mode
            )
            runnable = counts["pass"] + counts["mismatch"] + counts["error"]
            if runnable or counts[NOT_ON_CPU]:
                lines.append(
                    f"| {task} | {mode} | {counts['pass']} | {counts['mismatch']} | {counts['error']} | {_rate(counts['pass'], runnable)} |"
                )
    lines += ["", "## Top causes", "", "| cause | modes | architectures | e.g. |", "|---|---|---|---|"]
    grouped: dict[str, dict[str, Any]] = defaultdict(lambda: {"modes": set(), "archs": set()})
    for result in results:
        for mode in result["modes"]:
            if verdict(mode) in ("mismatch", "error"):
                entry = grouped[cause(mode)]
                entry["modes"].add(mode["mode"])
                entry["archs"].add(result["case"]["class_name"])
    for text, entry in sorted(grouped.items(), key=lambda item: -len(item[1]["archs"]))[:25]:
        examples = ", ".join(sorted(entry["archs"])[:4])
        lines.append(
            f"| {_cell(text)} | {', '.join(m for m in modes if m in entry['modes'])} | {len(entry['archs'])} | {examples} |"
        )
    lines += [
        "",
        "## Failing architectures",
        "",
        "| architecture | type | task | " + " | ".join(modes) + " | where it starts |",
        "|---|---|---|" + "---|" * len(modes) + "---|",
    ]
    for result in sorted(results, key=lambda r: r["case"]["class_name"]):
        by_mode = {m["mode"]: verdict(m) for m in result["modes"]}
        marks = [by_mode.get(mode, "—") for mode in modes]  # a mode checked on a sample only
        if all(mark in ("pass", NOT_ON_CPU, "—") for mark in marks):
            continue
        first = next(m for m in result["modes"] if verdict(m) in ("mismatch", "error"))
        lines.append(
            f"| {result['case']['class_name']} | {result['case']['model_type']} | {result['case']['task']} | "
            + " | ".join(marks)
            + f" | {_cell(_where(first))} |"
        )
    lines += ["", "## Not runnable on CPU from a tiny config", "", "| architecture | type | why |", "|---|---|---|"]
    for result in sorted(not_on_cpu, key=lambda r: r["case"]["class_name"]):
        error = result["modes"][0]["error"]
        lines.append(
            f"| {result['case']['class_name']} | {result['case']['model_type']} | {_cell(error['type'] + ': ' + error['message'].splitlines()[0] if error['message'] else error['type'])} |"
        )
    lines += ["", *_reproduce_lines(results, meta.get("merge_command"))]
    return "\n".join(lines).rstrip("\n") + "\n"


def _recheck_summary(results: list[dict[str, Any]]) -> str:
    rechecked = [r for r in results if r.get("confirmed_in_isolation")]
    if not rechecked:
        return " (none needed it in this run)"
    passed = [r for r in rechecked if not failed_on_device(r)]
    names = f": {', '.join(sorted(r['case']['class_name'] for r in passed))}" if passed else ""
    return f" ({len(rechecked)} re-checked, {len(passed)} of them passed in fresh processes{names})"


def merge_results(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Results of several sweeps over the same architectures (say, eager modes over all of them and compile over
    a sample, then a re-run of a few) as one list: one entry per architecture, its modes from every run, a later
    run's verdict replacing an earlier one's for the same mode."""
    merged: dict[str, dict[str, Any]] = {}
    for run in runs:
        for result in run:
            name = result["case"]["class_name"]
            if name not in merged:
                merged[name] = {**result, "modes": list(result["modes"])}
                continue
            entry = merged[name]
            replaced = {m["mode"] for m in result["modes"]}
            earlier = entry["modes"]
            entry["modes"] = [m for m in earlier if m["mode"] not in replaced] + result["modes"]
            if replaced & {m["mode"] for m in earlier}:  # a re-run: its own re-check (or none) is what counts
                entry["confirmed_in_isolation"] = False
            entry["wall_s"] = round(entry.get("wall_s", 0) + result.get("wall_s", 0), 1)
            entry["runs"] = [
                *entry.get("runs", []),
                *(r for r in result.get("runs", []) if r not in entry.get("runs", [])),
            ]
            entry["confirmed_in_isolation"] = entry.get("confirmed_in_isolation") or result.get(
                "confirmed_in_isolation"
            )
    return list(merged.values())


def _where(mode: dict[str, Any]) -> str:
    where = mode.get("localisation")
    error = mode.get("error")
    text = cause(mode) + (f" at {error['location']}" if error["location"] else "") if error else "mismatch"
    if where:
        text += f" — in `{where['module'] or '(model)'}` ({where['module_type']})"
        if where.get("op"):
            text += f" at `{where['op']}`"
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:220]


def _timing_lines(results: list[dict[str, Any]], modes: tuple[str, ...]) -> list[str]:
    rows = []
    for mode in modes:
        ratios = [
            m["tpu_step_s"] / m["cpu_step_s"]
            for r in results
            for m in r["modes"]
            if m["mode"] == mode and m.get("tpu_step_s") and m.get("cpu_step_s")
        ]
        if ratios:
            rows.append(f"| {mode} | {len(ratios)} | {statistics.median(ratios):.2f}x | {max(ratios):.2f}x |")
    if not rows:
        return []
    return [
        "Per-step time on `tpu` over CPU (a repeated forward + backward, after a warm-up step; measured under load):",
        "",
        "| mode | architectures | median | worst |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2, help="models checked in parallel (each in its own process)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per model (all modes)")
    parser.add_argument("--limit", type=int, default=0, help="check only the first N architectures (0: all)")
    parser.add_argument("--stride", type=int, default=1, help="check every Nth architecture (a spread over all tasks)")
    parser.add_argument("--only", default="", help="comma-separated model types to check (e.g. llama,bert,vit)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    parser.add_argument(
        "--compile-every",
        type=int,
        default=4,
        help="check compile on every Nth architecture of the mappings only (1: all; compile costs tens of seconds)",
    )
    parser.add_argument(
        "--max-memory-mb", type=int, default=6000, help="per worker process; more is an allocation error"
    )
    parser.add_argument("--timing", action="store_true", help="also time one repeated step per mode on CPU and tpu")
    parser.add_argument(
        "--localise-errors", action="store_true", help="also localise errors (mismatches always are; slower)"
    )
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="a fresh worker process for every model (default: one serving process per job, failures re-checked "
        "in fresh processes)",
    )
    parser.add_argument("--process-per-mode", action="store_true", help="with --isolated: one process per mode")
    parser.add_argument("--no-confirm", action="store_true", help="do not re-check failures in fresh processes")
    parser.add_argument("--resume", action="store_true", help="keep the results already in --json, check the rest")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "model-coverage.md")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw reports here")
    parser.add_argument(
        "--merge", type=Path, nargs="+", default=[], help="check nothing: write --output from these --json files"
    )
    parser.add_argument("--note", default="", help="a sentence for the page, e.g. how a merged run was selected")
    args = parser.parse_args(argv)
    if args.merge:
        merge_command = run_record(argv if argv is not None else sys.argv[1:])["command"]
        return write_merged(args.merge, args.output, args.note, merge_command)
    from tpu_agent.runtime.select import select_backend

    modes = tuple(m for m in args.modes.split(",") if m)
    every = architectures()
    cases = every
    if args.only:
        wanted = {name.strip() for name in args.only.split(",")}
        cases = [case for case in cases if case.model_type in wanted]
    cases = cases[:: max(1, args.stride)]
    if args.limit:
        cases = cases[: args.limit]
    compiled = compile_sample(every, args.compile_every)
    cases = [case for case in cases if case_modes(case, modes, compiled)]  # --modes compile: the sample only
    options = CheckOptions(
        modes=modes,
        backend="emulated",
        timeout_s=args.timeout,
        process_per_mode=args.process_per_mode,
        localise_errors=args.localise_errors,
        measure_steps=2 if args.timing else 0,
        max_memory_mb=args.max_memory_mb,
    )
    subset = len(cases) < len(every)
    run = run_record(argv if argv is not None else sys.argv[1:])
    meta = {
        **_versions(),
        "selected": len(cases),
        "available": len(every),
        "subset_note": f" (a subset: {run['command']})" if subset else "",
        "note": args.note,
    }
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    if args.resume and args.json and args.json.is_file():
        wanted_names = {case.class_name for case in cases}
        results = [r for r in json.loads(args.json.read_text()) if r["case"]["class_name"] in wanted_names]
        done = {r["case"]["class_name"] for r in results}
        cases = [case for case in cases if case.class_name not in done]
    backend = select_backend(options.backend).name
    local = threading.local()
    workers: list[ServingWorker] = []

    def check(case: Case) -> dict[str, Any]:
        result = checked(case)
        result["runs"] = [run]
        return result

    def checked(case: Case) -> dict[str, Any]:
        modes_here = case_modes(case, modes, compiled)
        if args.isolated:
            return run_case(case, options, modes=modes_here)
        if getattr(local, "worker", None) is None:
            local.worker = ServingWorker(options, backend)
            workers.append(local.worker)
        result = run_case(case, options, local.worker, modes_here)
        if failed_on_device(result) and not args.no_confirm:
            result = confirm_in_isolation(result, options)
        return result

    total = len(results) + len(cases)
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {pool.submit(check, case): case for case in cases}
            for future in as_completed(futures):
                result = future.result()
                results.append(result)
                run["wall_s"] = round(time.perf_counter() - started)
                marks = " ".join(f"{m['mode']}={verdict(m)}" for m in result["modes"])
                print(
                    f"[{len(results)}/{total}] {result['case']['class_name']}: {marks} ({result['wall_s']} s)",
                    file=sys.stderr,
                    flush=True,
                )
                # rewritten after every model, so an interrupted sweep still leaves a consistent report
                atomic_write_text(args.output, render_markdown(results, modes, meta))
                if args.json:
                    atomic_write_text(args.json, json.dumps(results, indent=1, default=str))
    finally:
        for worker in workers:
            worker.close()
    _print_totals(results, modes, args.output)
    return 0


def run_record(argv: list[str]) -> dict[str, Any]:
    """How a run was made, for the page's *Reproduce* section: the command, the commit it ran at (``+changes``
    when the tree differed from it) and, once it ends, its wall time."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty=+changes", "--abbrev=10"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    command = shlex.join(["python", "benchmarks/hf_coverage.py", *argv])
    return {"command": command, "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _reproduce_lines(results: list[dict[str, Any]], merge_command: str | None) -> list[str]:
    """The runs whose verdicts this page shows, each with the architectures it decided, and the merge command."""
    counted: dict[str, tuple[dict[str, Any], int]] = {}
    for result in results:
        for run in result.get("runs", []):
            key = run["command"] + run["commit"] + run["date"]
            counted[key] = (run, counted.get(key, (run, 0))[1] + 1)
    if not counted:
        return []
    lines = [
        "## Reproduce",
        "",
        "From the repository root with the `[hf]` extra installed (nothing is downloaded). `nice -n 19` and",
        "`--jobs` change only how long it takes; a run writes this page (and `--json`) after every architecture.",
        "",
    ]
    for run, count in counted.values():
        wall = f", {run['wall_s'] / 60:.0f} min wall on a shared 2-core machine" if run.get("wall_s") else ""
        lines += [f"    {run['command']}", "", f"at {run['commit']} on {run['date']}: {count} architectures{wall}.", ""]
    if merge_command:
        lines += [
            "The page is the merge of those runs' `--json` files (a later run's verdict replaces an",
            "earlier one's):",
            "",
            f"    {merge_command}",
            "",
        ]
    return lines


def _versions() -> dict[str, str]:
    import torch
    import transformers

    return {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }


def _print_totals(results: list[dict[str, Any]], modes: tuple[str, ...], output: Path) -> None:
    for mode in modes:
        counts = Counter(verdict(m) for r in results for m in r["modes"] if m["mode"] == mode)
        runnable = counts["pass"] + counts["mismatch"] + counts["error"]
        print(
            f"{mode}: {counts['pass']}/{runnable} pass ({_rate(counts['pass'], runnable)}), {counts['mismatch']} mismatch, "
            f"{counts['error']} error, {counts[NOT_ON_CPU]} not runnable on CPU"
        )
    print(f"wrote {output}")


def write_merged(paths: list[Path], output: Path, note: str, merge_command: str | None = None) -> int:
    """``--merge``: one page from several sweeps' ``--json`` files (e.g. eager modes over every architecture,
    compile over a sample), each architecture's modes taken from every file."""
    results = merge_results([json.loads(path.read_text(encoding="utf-8")) for path in paths])
    present = {m["mode"] for r in results for m in r["modes"]}
    modes = tuple(mode for mode in MODES if mode in present)
    available = len(architectures())
    meta = {
        **_versions(),
        "selected": len(results),
        "available": available,
        "subset_note": "",
        "note": note,
        "merge_command": merge_command,
    }
    atomic_write_text(output, render_markdown(results, modes, meta))
    _print_totals(results, modes, output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
