"""SD-4: a step whose compiled program moves so many collective bytes over ICI that they rival its compute.

SD-2 measures collective time on the emulated run; this rule reads the collectives the TPU compiler put into the
step compiled for the target slice (all-reduce, all-gather, reduce-scatter, ... with their bytes) and weighs
their time over the chip's inter-chip interconnect against the compiler's own time for the program.
"""

from __future__ import annotations

from tpu_agent.profile.compiled import CompiledCollective, CompiledStep
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import COMPILED, DiagnosticRule, by_site, share
from tpu_agent.profile.rules.sd_collective_bound import SHARE_THRESHOLD
from tpu_agent.runtime import events as ev

# Per byte of the collective's (full) array, a ring moves (n-1)/n of it per chip; an all-reduce is a
# reduce-scatter then an all-gather, twice that.
_RING_PASSES = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0, "all-to-all": 1.0}


def collective_seconds(collective: CompiledCollective, chips: int, ici_bytes_per_s: float) -> float:
    """The least time a collective of ``collective.bytes`` takes over a ring of ``chips`` chips."""
    passes = _RING_PASSES.get(collective.kind, 1.0) * (chips - 1) / chips
    return collective.bytes * passes / ici_bytes_per_s


def step_split(compiled: CompiledStep) -> tuple[float, float, dict[str, tuple[int, float]]]:
    """(collective seconds, computation seconds, per kind: count and bytes) of one step of the compiled program.

    The computation's time is the compiler's ``optimal_seconds``; should it already count some collective
    time, the share is understated, never overstated."""
    bandwidth = compiled.chip.ici_bandwidth_bytes_per_s
    collective_s = compute_s = 0.0
    kinds: dict[str, tuple[int, float]] = {}
    for program in compiled.programs:
        compute_s += program.optimal_seconds * program.calls
        for collective in program.collectives:
            collective_s += collective_seconds(collective, compiled.chips, bandwidth) * program.calls
            count, size = kinds.get(collective.kind, (0, 0.0))
            kinds[collective.kind] = (count + collective.count * program.calls, size + collective.bytes * program.calls)
    return collective_s, compute_s, kinds


def _advice(kind: str) -> tuple[str, str]:
    """What to change for the collective that dominates: (suggestion, agent change)."""
    if kind == "all-reduce":
        return (
            "The gradients' all-reduce (data parallelism) dominates: give each chip more work per reduction (a "
            "larger per-chip batch, or gradient accumulation over micro-batches), keep gradients in bf16, or "
            "shard with FSDP2 so the reduction becomes a reduce-scatter that overlaps the backward pass.",
            "Accumulate gradients over N micro-batches and skip the gradient all-reduce until the last one: wrap "
            "the first N-1 backward passes in `with model.no_sync():` (DDP), then call optimizer.step().",
        )
    if kind in ("all-gather", "reduce-scatter"):
        return (
            "FSDP's parameter all-gathers / gradient reduce-scatters dominate: raise the per-chip batch, shard "
            "over fewer chips and replicate across the rest (a (replicate, shard) mesh), or keep parameters in "
            "bf16 so half the bytes travel.",
            'Use a 2-D mesh: `init_device_mesh("tpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))` '
            "with fully_shard(model, mesh=mesh), so parameters are gathered within small groups only.",
        )
    return (
        f"{kind} traffic dominates: move less data between chips per step (larger per-chip work, bf16 "
        "tensors, a mesh that keeps the exchanged dimension local).",
        "Reduce the data exchanged between chips per step, or raise the work each chip does per exchange.",
    )


def _locations(model: ProfileModel) -> list[Location]:
    """The lines that issued collectives on the emulated run; else the model call the sharding wraps."""
    collectives = [e for rank in model.ranks.values() for e in rank.events if isinstance(e, ev.Collective)]
    sites = list(by_site(collectives))[:3]
    if sites:
        return [Location.from_site(site) for site in sites]
    rank = model.primary
    return [Location.from_site(site) for site in (rank.forward_site, rank.step_site) if site is not None]


def _check(model: ProfileModel) -> list[Finding]:
    compiled = model.compiled
    assert compiled is not None  # guaranteed by requires=(COMPILED,)
    collective_s, compute_s, kinds = step_split(compiled)
    if not kinds or collective_s <= 0:
        return []
    collective_share = share(collective_s, collective_s + compute_s)
    if collective_share < SHARE_THRESHOLD:
        return []
    dominant = max(kinds, key=lambda kind: kinds[kind][1])
    suggestion, change = _advice(dominant)
    listed = ", ".join(f"{kind} x{count} ({size / 2**20:.1f} MiB)" for kind, (count, size) in kinds.items())
    return [
        RULE.finding(
            f"Collectives take {collective_share:.0%} of the step compiled for {compiled.target} "
            f"({collective_s * 1e3:.3g} ms over ICI against {compute_s * 1e3:.3g} ms of computation): {listed}",
            Evidence("collective share of the compiled step", round(collective_share, 3), SHARE_THRESHOLD, "fraction"),
            _locations(model),
            suggestion + f" Per chip and step, from the compiled program ({compiled.strategy} sharding over "
            f"{compiled.chips} chips).",
            agent_change=AgentChange(change),
            saving_pct=collective_share * 50,
            confidence=0.6,
            rank=model.primary.rank,
        )
    ]


RULE = DiagnosticRule(
    code="SD-4",
    name="compiled step collective-bound",
    category="sharding",
    severity=Severity.warning,
    rationale="On a slice, the compiled step exchanges gradients or parameters over the inter-chip interconnect; "
    "when those bytes take as long as the computation, adding chips adds waiting, not speed.",
    before="model = DDP(model)  # per-chip batch 2: one full gradient all-reduce per tiny step",
    after="for i, batch in enumerate(micro_batches):  # larger per-chip work per all-reduce\n"
    "    with model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():\n"
    "        loss_fn(model(batch)).backward()\n"
    "optimizer.step()",
    references=(
        "docs/tpu-performance.md#the-compiled-program",
        "https://cloud.google.com/tpu/docs/system-architecture-tpu-vm",
    ),
    requires=(COMPILED,),
    check=_check,
)
