"""SH-4: tile padding in the program the TPU compiler built: array bytes its tiled layouts add, and the matmul
dims behind them that are not multiples of the MXU tile.

SH-2 predicts padding from the layer sizes the capture saw; this rule reads what the compiler did: the share
of the compiled step's array bytes that its layouts (``T(8,128)`` tiles) pad, and the dims of its costliest
matmuls. The layers whose weights have those dims are where the fix is made.
"""

from __future__ import annotations

import math

from tpu_agent.profile.compiled import CompiledMatmul, CompiledProgram, CompiledStep
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity, Weight
from tpu_agent.profile.rules._base import COMPILED, DiagnosticRule
from tpu_agent.profile.rules.sh_mxu_alignment import matmul_weights, padded_dim, percent_text, waste

PADDING_THRESHOLD = 0.09  # share of the program's array bytes that is layout padding
WARN_SAVING = 5.0


def misaligned_dims(matmuls: tuple[CompiledMatmul, ...], tile: int) -> list[int]:
    """The matmul result dims (the two minor ones, the MXU's) that are not multiples of ``tile``."""
    return sorted({dim for matmul in matmuls for dim in matmul.dims[-2:] if dim % tile})


def mxu_padding_share(program: CompiledProgram, tile: int) -> float:
    """FLOP-weighted share of the top matmuls' MXU output tiles that is padding (the contraction not counted)."""
    weighted = [
        (matmul.flops, waste(matmul.dims[-2:], tile)) for matmul in program.top_matmuls if len(matmul.dims) >= 2
    ]
    total = sum(flops for flops, _ in weighted)
    return sum(flops * wasted for flops, wasted in weighted) / total if total else 0.0


def _worst_program(compiled: CompiledStep) -> CompiledProgram | None:
    return max(compiled.programs, key=lambda program: program.layout_padding_fraction, default=None)


def _weights_with(weights: list[Weight], dims: list[int]) -> list[Weight]:
    """Weights of matmul layers (one per definition line) that have one of ``dims``: where the sizes are chosen."""
    wanted = set(dims)
    chosen: dict[object, Weight] = {}
    for weight in matmul_weights(weights):
        if wanted & set(weight.shape):
            chosen.setdefault(weight.site or weight.module, weight)
    return sorted(chosen.values(), key=lambda w: -math.prod(w.shape))


def _resized(dims: list[int], tile: int) -> str:
    return ", ".join(f"{dim}->{padded_dim(dim, tile)}" for dim in dims[:6])


def _check(model: ProfileModel) -> list[Finding]:
    compiled = model.compiled
    assert compiled is not None  # guaranteed by requires=(COMPILED,)
    program = _worst_program(compiled)
    if program is None or program.layout_padding_fraction < PADDING_THRESHOLD:
        return []
    tile = compiled.chip.mxu_tile
    dims = misaligned_dims(program.top_matmuls, tile)
    if not dims:
        return []
    rank = model.primary
    layers = _weights_with(rank.weights, dims)
    locations = [Location.from_site(w.site) for w in layers[:3] if w.site is not None]
    if not locations and rank.forward_site:
        locations.append(Location.from_site(rank.forward_site))
    mxu_share = mxu_padding_share(program, tile)
    matmul_flops = sum(matmul.flops for matmul in program.top_matmuls)
    saving = mxu_share * min(matmul_flops / program.flops, 1.0) * 100 if program.flops else 0.0
    layer_dims = [dim for dim in dims if any(dim in w.shape for w in layers)]
    data_dims = [dim for dim in dims if dim not in layer_dims]
    named = "; ".join(f"{w.module!r} ({w.module_type} {'x'.join(map(str, w.shape))})" for w in layers[:3])
    fixes = []
    if layer_dims:
        fixes.append(f"make the layer sizes multiples of {tile} ({_resized(layer_dims, tile)}) in {named}")
    if data_dims:
        fixes.append(
            f"dims {', '.join(map(str, data_dims[:6]))} come from the data (batch or sequence): pad them to a "
            f"multiple of {tile} or give each chip more rows"
        )
    return [
        RULE.finding(
            f"{percent_text(program.layout_padding_fraction)} of the array bytes of {program.name!r} compiled for "
            f"{compiled.target} is tile padding: dims {', '.join(map(str, dims[:6]))} are not multiples of {tile}",
            Evidence(
                "share of the compiled program's array bytes that is padding",
                round(program.layout_padding_fraction, 4),
                PADDING_THRESHOLD,
                "fraction",
            ),
            locations,
            f"The TPU compiler pads these dims to its tiles ({_resized(dims, tile)}); {percent_text(mxu_share)} of "
            f"the top matmuls' MXU output tiles is padding. To fix: {'; '.join(fixes)}.",
            severity=Severity.warning if saving >= WARN_SAVING else Severity.info,
            agent_change=AgentChange(
                f"{'; '.join(fixes)}. For a classifier head, pad the number of classes and mask the extra logits."
            ),
            saving_pct=saving,
            confidence=0.75,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="SH-4",
    name="compiled program tile padding",
    category="shapes",
    severity=Severity.warning,
    rationale="The TPU compiler lays arrays out in 8x128 tiles and feeds the MXU tile x tile; dims off those "
    "multiples are padded, and the padding costs HBM, bandwidth and MXU cycles for nothing.",
    before="self.proj = nn.Linear(1000, 3000)",
    after="self.proj = nn.Linear(1024, 3072)  # multiples of 128 (v5e); of 256 on v6e/v7",
    references=(
        "docs/tpu-performance.md#the-compiled-program",
        "https://cloud.google.com/tpu/docs/performance-guide",
    ),
    requires=(COMPILED,),
    check=_check,
)
