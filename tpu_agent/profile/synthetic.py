"""A synthetic capture in exactly the on-disk format ``tpu-agent profile`` writes, of any length.

Used to measure analysis time on long captures (``benchmarks/profile_bench.py``: 1,000 steps) and to test
the loader and rules on data with known answers, without running a model for minutes. The step is an MLP
training step (forward addmm/relu, backward mm, an optimizer update) with one ``.item()`` per step; its
sizes are chosen so that SH-2 (dims not multiples of the tile) and HS-1 (a host sync each step) fire.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from tpu_agent.profile.kineto import trace_document
from tpu_agent.profile.layout import CAPTURE_FILE, OPTIONS_FILE, TRACE_FILE, raw_dir
from tpu_agent.profile.model import Op
from tpu_agent.runtime import events as ev

BASE_NS = 1_800_000_000_000_000_000
STEP_NS = 4_000_000
SCRIPT_LINES = {"forward": 12, "item": 16, "optimizer": 14, "weight": 5}


def _step_ops(start: int, batch: int, hidden: int, out: int) -> list[Op]:
    t = start + 100_000
    ops = []
    plan: list[tuple[str, list[list[int]], int]] = [
        ("aten::addmm", [[hidden], [batch, hidden], [hidden, hidden]], 600_000),
        ("aten::relu", [[batch, hidden]], 50_000),
        ("aten::addmm", [[out], [batch, hidden], [hidden, out]], 400_000),
        ("aten::mse_loss", [[batch, out], [batch, out]], 80_000),
        ("aten::mm", [[batch, out], [out, hidden]], 400_000),
        ("aten::mm", [[hidden, batch], [batch, hidden]], 600_000),
        ("aten::add_", [[hidden, hidden], [hidden, hidden]], 100_000),
        ("aten::_local_scalar_dense", [[]], 20_000),
    ]
    for name, dims, duration in plan:
        ops.append(Op(name, t, duration, thread=1, input_shapes=dims, input_dtypes=["float"] * len(dims)))
        t += duration + 30_000
    return ops


def write_capture(
    logdir: Path,
    steps: int = 1000,
    script: Path | None = None,
    batch: int = 64,
    hidden: int = 200,
    out: int = 100,
    args: tuple[str, ...] = (),
    dispatched: int = 8,
) -> Path:
    """Write a ``steps``-step capture under ``logdir`` and return its raw directory (``args``: the script's own
    command line, as its ``sys.argv[1:]``; ``dispatched``: ops the runtime dispatched per step, 50 and more
    make EM-3's "nothing is compiled")."""
    raw = raw_dir(logdir)
    raw.mkdir(parents=True, exist_ok=True)
    script_path = str(script or logdir / "train.py")
    site = {name: ev.Site(script_path, line, "<module>") for name, line in SCRIPT_LINES.items()}
    records: list[ev.Event] = [
        ev.RunInfo(
            BASE_NS,
            0,
            0,
            backend="emulated",
            chip="v5e",
            eager_mode="DEFER_NEVER",
            world_size=1,
            argv=[script_path, *args],
            env={},
        )
    ]
    ops: list[Op] = []
    warmup = 2
    for index in range(steps):
        start = BASE_NS + index * STEP_NS
        records.append(ev.StepMarker(start, 0, index, phase="begin", source="optimizer"))
        records.append(ev.HostSync(start + 3_500_000, 0, index, op="item", site=site["item"]))
        records.append(ev.OpBatch(start + STEP_NS - 2, 0, index, count=dispatched, by_name={"aten.addmm.default": 2}))
        records.append(ev.MemorySample(start + STEP_NS - 1, 0, index, allocated_bytes=1 << 20, peak_bytes=2 << 20))
        records.append(ev.StepMarker(start + STEP_NS, 0, index, phase="end", source="optimizer"))
        if index >= warmup:
            ops.extend(_step_ops(start, batch, hidden, out))
    (raw / ev.EVENTS_FILE_PATTERN.format(rank=0)).write_text(
        "\n".join(ev.to_json(r) for r in records) + "\n", encoding="utf-8"
    )
    (raw / TRACE_FILE.format(rank=0)).write_text(json.dumps(trace_document(ops, BASE_NS)), encoding="utf-8")
    weight = {
        "module": "fc1",
        "module_type": "Linear",
        "shape": [hidden, hidden],
        "dtype": "float32",
        "site": asdict(site["weight"]),
    }
    record = {
        "rank": 0,
        "host": "synthetic",
        "window": [warmup, steps - 1],
        "step_site": asdict(site["optimizer"]),
        "forward_site": asdict(site["forward"]),
        "module_types": ["Mlp"],
        "weights": [weight],
        "memory": {"param_bytes": hidden * hidden * 4, "grad_bytes": hidden * hidden * 4, "optimizer_bytes": 0},
        "dataloaders": [],
        "data_waits": [],
    }
    (raw / CAPTURE_FILE.format(rank=0)).write_text(json.dumps(record), encoding="utf-8")
    options = {
        "script": script_path,
        "args": list(args),
        "steps": steps - warmup,
        "warmup": warmup,
        "chip": "v5e",
        "nproc": 1,
        "session": "2026_01_01_00_00_00",
    }
    (raw / OPTIONS_FILE).write_text(json.dumps(options), encoding="utf-8")
    return raw
