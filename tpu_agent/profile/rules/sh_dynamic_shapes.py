"""SH-1: tensor shapes that change between steps (each new shape is a new TPU compile)."""

from __future__ import annotations

from collections import Counter

from tpu_agent.profile import patches, sources
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, Op, ProfileModel, RankProfile, Severity
from tpu_agent.profile.op_classes import MXU_OPS
from tpu_agent.profile.rules._base import HOOKS, OP_TRACE, STEPS, DiagnosticRule, window_steps
from tpu_agent.profile.rules.co_recompiles import shape_change
from tpu_agent.runtime import events as ev

Signature = tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]


def _signature(ops: list[Op]) -> Signature:
    return tuple(sorted((op.name, tuple(tuple(d) for d in op.input_shapes)) for op in ops))


def _varying_dims(first_ops: dict[int, Op]) -> list[str]:
    """Human description of which input dims of the step's first matmul differ across steps."""
    ops = list(first_ops.values())
    if not ops:
        return []
    described = []
    for i, shape in enumerate(ops[0].input_shapes):
        for d in range(len(shape)):
            values = [op.input_shapes[i][d] for op in ops if i < len(op.input_shapes) and d < len(op.input_shapes[i])]
            if len(set(values)) > 1:
                shown = ", ".join(str(v) for v in sorted(set(values))[:8])
                described.append(f"{ops[0].name} input {i} dim {d} took values {shown}")
    return described


def _first_varying_input(per_step: dict[int, list[Op]]) -> tuple[int, int, list[int]] | None:
    """The first op of the step (in time order) whose input shape varies across steps: the tensor the step
    received is usually its first input. Returns (rank, dim, sizes) of that input. A batch has two or more
    dimensions: a 1-D input that varies first (the lengths a ``pad_sequence`` collate concatenates) is taken only
    when no batched one varies."""
    firsts: dict[str, dict[int, Op]] = {}
    order: list[str] = []
    for index, ops in per_step.items():
        for op in ops:
            if op.name not in firsts:
                firsts[op.name] = {}
                order.append(op.name)
            firsts[op.name].setdefault(index, op)
    flat: tuple[int, int, list[int]] | None = None
    for name in order:
        ops = list(firsts[name].values())
        for i, shape in enumerate(ops[0].input_shapes):
            same_rank = [
                op.input_shapes[i] for op in ops if i < len(op.input_shapes) and len(op.input_shapes[i]) == len(shape)
            ]
            for d in range(len(shape)):
                sizes = sorted({s[d] for s in same_rank})
                if len(sizes) > 1 and len(shape) >= 2:
                    return len(shape), d, sizes
                if len(sizes) > 1 and flat is None:
                    flat = (len(shape), d, sizes)
    return flat


def _padding_change(
    rank_profile: RankProfile, per_step: dict[int, list[Op]]
) -> tuple[list[Location], AgentChange | None]:
    """The line creating the model's changing input (before the forward call) and the edit padding it."""
    site = rank_profile.forward_site
    if site is None:
        return [], None
    origin = sources.origin_of_call_inputs(site.file, site.line)
    if origin is None or origin.line == site.line:
        return [], None
    varying = _first_varying_input(per_step)
    if varying is None:  # a compiled region hides the input's shape: the line is known, the dimension is not
        return sources.origin_locations(site.file, origin), None
    rank, dim, sizes = varying
    return sources.shape_change(site.file, origin, dim, sizes, rank)


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    steps = window_steps(rank)
    if len(steps) < 2:
        return []
    per_step: dict[int, list[Op]] = {i: [] for i in steps}
    for op in rank.ops:
        if op.costed and op.step in per_step and op.name in MXU_OPS:
            per_step[op.step].append(op)
    if not any(per_step.values()):
        for op in rank.ops:
            if op.top_level and op.step in per_step:
                per_step[op.step].append(op)
    signatures = {i: frozenset(_signature(ops)) for i, ops in per_step.items()}
    common, _ = Counter(signatures.values()).most_common(1)[0]
    # A step whose (op, input shapes) pairs are a subset or a superset of the usual step's ran fewer or more ops on
    # the same shapes (a layer frozen, then unfrozen: its weight-gradient matmuls come and go); only a step with a
    # pair the usual one lacks and the other way round saw a shape change.
    changed = [i for i in steps if not (signatures[i] <= common or signatures[i] >= common)]
    if not changed:
        return []
    distinct = len({signatures[i] for i in changed} | {common})
    first_ops = {i: ops[0] for i, ops in per_step.items() if ops}
    what = _varying_dims(first_ops)
    step_ops = {i: [op for op in rank.ops if op.top_level and op.step == i] for i in steps}
    locations, padding = _padding_change(rank, step_ops)
    if not locations:  # the model runs inside a compiled region: the recompiles' guard names the changing argument
        recompiles = [e for e in rank.events if isinstance(e, ev.Compile) and e.is_recompile]
        locations = shape_change(recompiles)[0]
    change = padding or AgentChange(
        "Pad the varying dimension to a few fixed buckets (e.g. multiples of 128 up to the maximum) before the model, "
        "or fix the sequence length in the data pipeline."
    )
    if rank.forward_site:
        locations.append(Location.from_site(rank.forward_site))
    for loader in rank.dataloaders:
        if loader.site is None:
            continue
        locations.append(Location.from_site(loader.site))
        remainder = loader.batch_size and loader.dataset_len and loader.dataset_len % loader.batch_size
        if remainder and not loader.drop_last:
            diff = patches.add_call_kwargs(loader.site.file, loader.site.line, "DataLoader", {"drop_last": "True"})
            if diff:
                change = AgentChange(
                    f"The last batch has {remainder} samples instead of {loader.batch_size}: drop it with "
                    "drop_last=True"
                    + ("; also pad the varying dimension to fixed buckets." if len(changed) > 1 else "."),
                    diff,
                )
    share = len(changed) / len(steps)
    return [
        RULE.finding(
            f"Input shapes changed in {len(changed)} of {len(steps)} steps ({distinct} distinct shape sets)"
            + (f": {what[0]}" if what else ""),
            Evidence("distinct shape sets", distinct, 1, "shape sets", tuple(changed)),
            locations,
            "TorchTPU compiles one program per input shape: every new shape is a recompile. Pad to a few buckets "
            "(TorchTPU docs: e.g. 128/512/1024), keep batch size fixed with drop_last=True."
            + (" Changing: " + "; ".join(what[:3]) if what else ""),
            severity=Severity.error if share >= 0.3 else Severity.warning,
            agent_change=change,
            saving_pct=min(share * 90, 90.0),
            confidence=0.75,
            time_ns=next((op.start_ns for i in changed for op in per_step[i][:1]), None),
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="SH-1",
    name="shapes change between steps",
    category="shapes",
    severity=Severity.warning,
    rationale="Static shapes are mandatory for TorchTPU graphs; a new shape means a cache miss and a full compile.",
    before="batch = pad_sequence(samples)  # length = longest sample",
    after="batch = pad_to_bucket(samples, buckets=(128, 256, 512))",
    references=(
        "docs/tpu-performance.md#shapes",
        "https://cloud.google.com/tpu/docs/performance-guide",
    ),
    requires=(STEPS, OP_TRACE, HOOKS),
    check=_check,
)
