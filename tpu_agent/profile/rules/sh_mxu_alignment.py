"""SH-2: matmul weight dims that are not multiples of the MXU tile (128 on v5e and older, 256 on v6e+)."""

from __future__ import annotations

import math

from tpu_agent.profile import patches
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity, Weight
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule, matmul_time_share

WASTE_THRESHOLD = 0.10  # padded work / real work - 1
MIN_PARAM_SHARE = 0.02  # ignore weights holding < 2 % of matmul parameters
WARN_SAVING = 5.0


def _padded(dim: int, tile: int) -> int:
    return math.ceil(dim / tile) * tile


def waste(shape: tuple[int, ...], tile: int) -> float:
    """Extra MXU work from padding the two matmul dims of a weight to the tile."""
    out_dim, in_dim = shape[0], math.prod(shape[1:])
    return _padded(out_dim, tile) * _padded(in_dim, tile) / (out_dim * in_dim) - 1


def _matmul_weights(weights: list[Weight]) -> list[Weight]:
    return [w for w in weights if w.module_type not in ("Embedding", "EmbeddingBag") and len(w.shape) >= 2]


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    chip = model.config.chip
    tile = chip.mxu_tile
    weights = _matmul_weights(rank.weights)
    total = sum(math.prod(w.shape) for w in weights)
    if not total:
        return []
    matmul_share = matmul_time_share(rank)
    # One finding per definition: the same line builds every block's layer, and the fix is made there once.
    groups: dict[tuple[object, tuple[int, ...]], list[Weight]] = {}
    for weight in weights:
        groups.setdefault((weight.site or weight.module, weight.shape), []).append(weight)
    findings = []
    for (_, shape), members in groups.items():
        extra = waste(shape, tile)
        param_share = math.prod(shape) * len(members) / total
        if extra < WASTE_THRESHOLD or param_share < MIN_PARAM_SHARE:
            continue
        first = members[0]
        saving = matmul_share * param_share * extra / (1 + extra) * 100
        out_dim, in_dim = shape[0], math.prod(shape[1:])
        names = (
            first.module
            if len(members) == 1
            else f"{first.module} and {len(members) - 1} more ({', '.join(m.module for m in members[1:4])}{', ...' if len(members) > 4 else ''})"
        )
        code = patches.line_text(first.site.file, first.site.line) if first.site else ""
        findings.append(
            RULE.finding(
                f"{names}: {first.module_type} {in_dim}->{out_dim} wastes {extra:.0%} of its MXU work on {chip.key} (tile {tile})",
                Evidence("MXU padding waste", round(extra, 3), WASTE_THRESHOLD, "fraction"),
                [Location.from_site(first.site, round(saving / 100, 4))] if first.site else [],
                f"Pad the dims to multiples of {tile}: in {in_dim}->{_padded(in_dim, tile)}, out "
                f"{out_dim}->{_padded(out_dim, tile)} (and the layers it feeds), or pick sizes that are multiples of {tile}."
                + (f" Defined at: {code}" if code else ""),
                severity=Severity.warning if saving >= WARN_SAVING else Severity.info,
                agent_change=AgentChange(
                    f"Change the layer sizes of {first.module} to multiples of {tile} and adjust its neighbours; "
                    "for a classifier head, pad the number of classes and mask the extra logits."
                ),
                saving_pct=saving,
                confidence=0.6,
                rank=rank.rank,
            )
        )
    return findings


RULE = DiagnosticRule(
    id="SH-2",
    name="MXU-misaligned matmul dims",
    category="shapes",
    severity=Severity.warning,
    rationale="The MXU is a tile x tile systolic array; dims are padded up to the tile, and the padding is wasted work.",
    before="self.fc1 = nn.Linear(100, 300)",
    after="self.fc1 = nn.Linear(128, 384)  # v5e tile 128; use 256 multiples on v6e/v7",
    reference="profiling_anchors.md §3.5 SH-2; chips.py (mxu_tile)",
    requires=(STEPS, HOOKS),
    check=_check,
)
