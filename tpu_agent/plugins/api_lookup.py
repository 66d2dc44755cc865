"""CUDA-to-TorchTPU API lookup over the mapping table shipped as package data (``data/cuda_to_tpu.json``).

The table is data, derived from the bundled references, so a new row is a JSON edit; this module only
loads it and ranks rows against a query such as ``torch.cuda.synchronize`` or ``GradScaler``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from tpu_agent.errors import TpuAgentError


@dataclass(frozen=True)
class ApiMapping:
    cuda: str
    tpu: str
    status: str
    note: str
    reference: str
    keywords: tuple[str, ...]


@lru_cache(maxsize=1)
def load_table() -> tuple[dict[str, str], tuple[ApiMapping, ...]]:
    """(status legend, rows) from the packaged JSON."""
    raw = resources.files("tpu_agent.plugins").joinpath("data/cuda_to_tpu.json").read_text(encoding="utf-8")
    data = json.loads(raw)
    rows = tuple(
        ApiMapping(
            cuda=e["cuda"],
            tpu=e["tpu"],
            status=e["status"],
            note=e["note"],
            reference=e["reference"],
            keywords=tuple(e["keywords"]),
        )
        for e in data["entries"]
    )
    return dict(data["statuses"]), rows


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
    scored = sorted(((s, i, row) for i, row in enumerate(rows) if (s := _score(query, row)) > 0), key=lambda t: (-t[0], t[1]))
    if not scored:
        raise TpuAgentError(
            "unknown-api",
            f"no CUDA API in the mapping table matches {query!r}",
            "Try the bare name (e.g. 'synchronize', 'GradScaler', 'nccl'), or call tpu_scan to find CUDA "
            "usages with the rule that covers them.",
        )
    return [row for _, _, row in scored[:limit]]


__all__ = ["ApiMapping", "load_table", "lookup"]
