"""SH-2: matmul weight dims that are not multiples of the MXU tile (128 on v5e and older, 256 on v6e+)."""

from __future__ import annotations

import math

from tpu_agent.profile import patches
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity, Weight
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule, matmul_time_share

WASTE_THRESHOLD = 0.09  # share of the padded MXU work that is padding (0.09: 10 % extra work over the real)
MIN_PARAM_SHARE = 0.02  # ignore weights holding < 2 % of matmul parameters
WARN_SAVING = 5.0
NO_DIFF = (
    "resizing a layer changes the model (new parameters, other initial values, other outputs), so the patched run's "
    "losses cannot match the script's, which verification requires of every diff"
)


def padded_dim(dim: int, tile: int) -> int:
    return math.ceil(dim / tile) * tile


def waste(shape: tuple[int, ...], tile: int) -> float:
    """The share of the MXU work on this weight that is padding, in [0, 1).

    A share, not "extra work over the real": a Linear(8, 8) on a 256 tile does 1024x the work it needs, and
    "wastes 102300 %" says nothing a reader can weigh; "99.9 % of its MXU work is padding" does.
    """
    out_dim, in_dim = shape[0], math.prod(shape[1:])
    return 1 - (out_dim * in_dim) / (padded_dim(out_dim, tile) * padded_dim(in_dim, tile))


def percent_text(fraction: float) -> str:
    """``fraction`` as a percentage that never rounds up to 100 % (nor shows 0 % for a share above zero)."""
    tenths = math.floor(fraction * 1000)
    return f"{tenths / 10:g}%" if tenths < 1000 else "100%"


def matmul_weights(weights: list[Weight]) -> list[Weight]:
    """The weights that feed matmuls (embedding tables are looked up, not multiplied)."""
    return [w for w in weights if w.module_type not in ("Embedding", "EmbeddingBag") and len(w.shape) >= 2]


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    chip = model.config.chip
    tile = chip.mxu_tile
    weights = matmul_weights(rank.weights)
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
        wasted = waste(shape, tile)
        param_share = math.prod(shape) * len(members) / total
        if wasted < WASTE_THRESHOLD or param_share < MIN_PARAM_SHARE:
            continue
        first = members[0]
        saving = matmul_share * param_share * wasted * 100
        out_dim, in_dim = shape[0], math.prod(shape[1:])
        names = (
            first.module
            if len(members) == 1
            else f"{first.module} and {len(members) - 1} more ({', '.join(m.module for m in members[1:4])}{', ...' if len(members) > 4 else ''})"
        )
        code = patches.line_text(first.site.file, first.site.line) if first.site else ""
        findings.append(
            RULE.finding(
                f"{names}: {first.module_type} {in_dim}->{out_dim}: {percent_text(wasted)} of its MXU work on "
                f"{chip.key} "
                f"is padding (tile {tile})",
                Evidence("share of MXU work that is padding", round(wasted, 4), WASTE_THRESHOLD, "fraction"),
                [Location.from_site(first.site, round(saving / 100, 4))] if first.site else [],
                f"Pad the dims to multiples of {tile}: in {in_dim}->{padded_dim(in_dim, tile)}, out "
                f"{out_dim}->{padded_dim(out_dim, tile)} (and the layers it feeds), or pick sizes that are multiples of "
                f"{tile}." + (f" Defined at: {code}" if code else ""),
                severity=Severity.warning if saving >= WARN_SAVING else Severity.info,
                agent_change=AgentChange(
                    f"Change the layer sizes of {first.module} to multiples of {tile} and adjust its neighbours; "
                    "for a classifier head, pad the number of classes and mask the extra logits.",
                    no_diff_reason=NO_DIFF,
                ),
                saving_pct=saving,
                confidence=0.6,
                rank=rank.rank,
            )
        )
    return findings


RULE = DiagnosticRule(
    code="SH-2",
    name="MXU-misaligned matmul dims",
    category="shapes",
    severity=Severity.warning,
    rationale="The MXU is a tile x tile systolic array; dims are padded up to the tile, and the padding is wasted "
    "work.",
    before="self.fc1 = nn.Linear(100, 300)",
    after="self.fc1 = nn.Linear(128, 384)  # v5e tile 128; use 256 multiples on v6e/v7",
    references=(
        "docs/tpu-performance.md#shapes",
        "https://cloud.google.com/tpu/docs/performance-guide",
    ),
    requires=(STEPS, HOOKS),
    check=_check,
)
