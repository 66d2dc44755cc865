"""CUDA-to-TorchTPU API lookup, answered from the migration rule records.

Every row is one :class:`~tpu_agent.migrate.model.ApiEquivalent` of one rule (``Rule.apis``): what the CUDA API
becomes, with the rule's safety as the status, its references and the oldest torch that has the emitted API.
There is no second table: what ``tpu_lookup_api`` says about an API is what ``tpu-agent migrate`` does to it,
so the two can never disagree. This module only flattens the records and ranks rows against a query such
as ``torch.cuda.synchronize`` or ``GradScaler``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from tpu_agent.errors import TpuAgentError
from tpu_agent.migrate.model import Rule, Safety

# What each status means; a status is the safety class of the rule that covers the API.
STATUSES: dict[Safety, tuple[str, str]] = {
    Safety.SAFE: ("rewrite", "tpu-agent migrate rewrites it to the TPU form by default"),
    Safety.UNSAFE: (
        "unsafe-rewrite",
        "tpu-agent migrate rewrites it only with --unsafe-fixes: the fix rests on an assumption the note names",
    ),
    Safety.MANUAL: ("manual", "no automatic rewrite: a person ports it; tpu-agent migrate reports it with this advice"),
}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


@dataclass(frozen=True)
class ApiMapping:
    """One lookup row: a CUDA API, its TPU form and the rule that decides it."""

    cuda: str
    tpu: str
    status: str  # rewrite | unsafe-rewrite | manual (see STATUSES)
    note: str
    reference: str
    keywords: tuple[str, ...]
    rule: str  # the rule code, e.g. "TPU203"; `tpu-agent rules CODE` explains it
    since_torch: str | None = None


def _row(rule: Rule, index: int) -> ApiMapping:
    api = rule.apis[index]
    status, _ = STATUSES[rule.safety]
    note = f"{rule.code} {rule.name}: {api.note or rule.summary}"
    if rule.since_torch:
        note += f" Needs torch >= {rule.since_torch}."
    names = {name.strip(".") for name in _IDENTIFIER.findall(api.cuda)}
    keywords = {part for name in names for part in (name, name.rpartition(".")[2]) if len(part) > 2}
    return ApiMapping(
        cuda=api.cuda,
        tpu=api.tpu,
        status=status,
        note=note,
        reference=rule.reference,
        keywords=tuple(sorted(keywords)),
        rule=rule.code,
        since_torch=rule.since_torch,
    )


@lru_cache(maxsize=1)
def load_table() -> tuple[dict[str, str], tuple[ApiMapping, ...]]:
    """(status legend, rows), built from every rule's ``apis`` in code order."""
    from tpu_agent.migrate.rules import ALL_RULES

    rows = tuple(_row(rule, i) for _, rule in sorted(ALL_RULES.items()) for i in range(len(rule.apis)))
    return dict(STATUSES.values()), rows


def _tokens(text: str) -> set[str]:
    return {t for t in re.split(r"[^a-z0-9_]+", text.lower()) if len(t) > 1 and t not in {"torch", "cuda"}}


def _score(query: str, row: ApiMapping) -> float:
    q = query.lower().strip()
    bare = q.removeprefix("torch.cuda.").removeprefix("torch.").rstrip("()")
    score = 0.0
    if q and q in row.cuda.lower():
        score += 10
    elif bare and bare in row.cuda.lower():
        score += 6
    for keyword in row.keywords:
        k = keyword.lower()
        if k == bare or k == q:
            score += 5
        elif k in q:
            score += 2
    shared = _tokens(query) & (_tokens(row.cuda) | {k.lower() for k in row.keywords})
    return score + len(shared)


def lookup(query: str, limit: int = 5) -> list[ApiMapping]:
    """Rows that best match ``query``, best first; :class:`TpuAgentError` when nothing matches."""
    if not query.strip():
        raise TpuAgentError("empty-query", "the query is empty", "Pass a CUDA API such as 'torch.cuda.synchronize'.")
    _, rows = load_table()
    scored = sorted(
        ((s, i, row) for i, row in enumerate(rows) if (s := _score(query, row)) > 0), key=lambda t: (-t[0], t[1])
    )
    if not scored:
        raise TpuAgentError(
            "unknown-api",
            f"no CUDA API covered by the migration rules matches {query!r}",
            "Try the bare name (e.g. 'synchronize', 'GradScaler', 'nccl'), run `tpu-agent rules` for the catalogue, "
            "or call tpu_scan to find CUDA usages with the rule that covers them.",
        )
    return [row for _, _, row in scored[:limit]]


__all__ = ["STATUSES", "ApiMapping", "load_table", "lookup"]
