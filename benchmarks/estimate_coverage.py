"""Estimate coverage: ``tpu-agent estimate --capture-only`` over one architecture per Hugging Face model class (the
selection of ``benchmarks/hf_coverage.py``), each a training step (forward + backward + AdamW) of its tiny config,
written to docs/estimate-coverage.md with each failure's cause.

Each case runs this file as the estimated script (``--train MODEL_TYPE TASK``): the tiny model is built as
``tpu-agent check`` builds it, moved to ``tpu``, and trained for three AdamW steps on the check's example inputs
(loss: the mean of every floating output). A case whose tiny model does not build, or whose training step fails on plain
CPU, says nothing about the estimate: it is listed, and left out of the pass rate.

Target (issue 34): >= 95 % of the architectures whose step runs on CPU estimate on a v5e.

    python benchmarks/estimate_coverage.py [--stride 10] [--limit 20] [--only llama,bert] [--timeout 300]
        [--chip v5e] [--output docs/estimate-coverage.md] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TARGET = 0.95
NOT_BUILT = "exit 3"  # the --train child's exit code when the tiny model does not build


def train(model_type: str, task: str, steps: int = 3, device_name: str = "tpu") -> None:
    """The estimated script: the tiny model's training step on ``tpu`` (or, to see whether it runs at all, on the
    CPU), as a user's script would run it."""
    import torch

    from tpu_agent.check import ModelSpec
    from tpu_agent.check.build import build
    from tpu_agent.check.execute import tree_to
    from tpu_agent.check.spec import HF_TYPE

    try:
        built = build(ModelSpec(HF_TYPE, model_type, task), max_parameters=10**9)
    except Exception as error:  # noqa: BLE001 - the tiny model does not build: not the estimate's failure
        print(f"NOT BUILT: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(3)
    device = torch.device(device_name)
    model = built.model.train().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    args, kwargs = tree_to(built.invocation, device)
    for step in range(steps):
        output = model(*args, **kwargs)
        values = output.values() if isinstance(output, dict) else output if isinstance(output, tuple) else [output]
        floats = [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point() and v.requires_grad]
        loss = sum(v.float().mean() for v in floats)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step} loss {float(loss):.4f}")


def runs_on_cpu(model_type: str, task: str, timeout: float) -> str | None:
    """Why one training step of the tiny model fails on plain CPU (None: it runs): such a model says nothing
    about the estimate."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(Path(__file__).resolve()), "--cpu", model_type, task]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return f"timeout after {timeout:.0f} s on CPU"
    errors = [line for line in proc.stderr.splitlines() if "Error:" in line] or [f"exit {proc.returncode}"]
    return None if proc.returncode == 0 else f"not on CPU: {errors[-1]}"[:200]


def run_case(model_type: str, task: str, chip: str, timeout: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TPU_AGENT_HOOKS", None)
    on_cpu = runs_on_cpu(model_type, task, timeout)
    if on_cpu is not None:
        return {"status": "not built", "cause": on_cpu, "wall_s": 0.0}
    command = [
        sys.executable, "-m", "tpu_agent", "estimate", "--capture-only", "--chip", chip, "--format", "json",
        "--no-suggest", str(Path(__file__).resolve()), "--train", model_type, task,
    ]  # fmt: skip
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"status": "error", "cause": f"timeout after {timeout:.0f} s", "wall_s": timeout}
    wall = round(time.perf_counter() - started, 1)
    try:
        document = json.loads(proc.stdout)
    except json.JSONDecodeError:
        document = {}
    if "estimate" in document:
        return {"status": "pass", "verdict": document["estimate"]["verdict"], "wall_s": wall}
    if "NOT BUILT" in proc.stderr:
        line = next(text for text in proc.stderr.splitlines() if text.startswith("NOT BUILT"))
        return {"status": "not built", "cause": line[:200], "wall_s": wall}
    error = document.get("error", {})
    cause = f"{error.get('code', 'no-json')}: {error.get('message', proc.stderr.strip().splitlines()[-1:])}"
    return {"status": "error", "cause": str(cause).replace(f"{ROOT}/", "")[:300], "wall_s": wall}


def render(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    counts = Counter(result["status"] for result in results)
    built = counts["pass"] + counts["error"]
    rate = f"{counts['pass'] / built:.1%}" if built else "n/a"
    lines = [
        "# Estimate coverage",
        "",
        "Generated by `benchmarks/estimate_coverage.py` (do not edit by hand). Each architecture (one model class",
        "of transformers' causal-LM, masked-LM, seq2seq and image-classification auto mappings, the selection of",
        "`benchmarks/hf_coverage.py`) is built from its tiny config and trained for three AdamW steps on `tpu`",
        f"under `tpu-agent estimate --capture-only --chip {meta['chip']}`; a pass is an estimate of a whole step.",
        "",
        f"Run: {meta['date']}, {len(results)} architectures ({meta['selection']}).",
        "",
        "| architectures | pass | error | not runnable on CPU from a tiny config | pass rate (of CPU-runnable) | target |",
        "|---|---|---|---|---|---|",
        f"| {len(results)} | {counts['pass']} | {counts['error']} | {counts['not built']} | {rate} | >= {TARGET:.0%} |",
        "",
        "| model type | task | result | cause | wall (s) |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        detail = result.get("verdict", "") if result["status"] == "pass" else result.get("cause", "")
        detail = str(detail).replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {result['model_type']} | {result['task']} | {result['status']} | {detail} | {result['wall_s']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] in ("--train", "--cpu"):
        train(sys.argv[2], sys.argv[3], *((1, "cpu") if sys.argv[1] == "--cpu" else ()))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stride", type=int, default=1, help="every Nth architecture (a spread over all tasks)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N of the selection (0: all)")
    parser.add_argument("--only", default="", help="comma-separated model types (e.g. llama,bert,vit)")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--chip", default="v5e")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "estimate-coverage.md")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    from hf_coverage import architectures

    from tpu_agent.fsutil import atomic_write_text

    cases = architectures()
    if args.only:
        cases = [case for case in cases if case.model_type in {n.strip() for n in args.only.split(",")}]
    cases = cases[:: max(1, args.stride)]
    cases = cases[: args.limit] if args.limit else cases
    results = []
    for case in cases:
        result = {
            "model_type": case.model_type,
            "task": case.task,
            **run_case(case.model_type, case.task, args.chip, args.timeout),
        }
        print(f"{case.model_type:24} {case.task:22} {result['status']:10} {result.get('cause', '')[:120]}", flush=True)
        results.append(result)
    selection = (
        f"--stride {args.stride}"
        + (f" --limit {args.limit}" if args.limit else "")
        + (f" --only {args.only}" if args.only else "")
    )
    meta = {"date": time.strftime("%Y-%m-%d"), "chip": args.chip, "selection": selection}
    atomic_write_text(args.output, render(results, meta))
    if args.json:
        atomic_write_text(args.json, json.dumps(results, indent=2))
    counts = Counter(result["status"] for result in results)
    built = counts["pass"] + counts["error"]
    print(f"pass {counts['pass']} of {built} built ({counts['pass'] / built:.1%})" if built else "nothing built")


if __name__ == "__main__":
    main()
