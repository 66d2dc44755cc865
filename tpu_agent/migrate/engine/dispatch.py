"""Which rule handlers see which node: the per-process index the pass dispatches through.

Each node is dispatched by its type to the handlers registered for it; dotted references
(``torch.cuda.synchronize``, ``tc.synchronize`` after ``import torch.cuda as tc``) go to the reference handler
with the longest matching qualified-name prefix, so two families never both handle one reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpu_agent.migrate.rules._base import Family, LeaveFn, RefFn, VisitFn


@dataclass(frozen=True)
class Dispatch:
    """Handlers of every enabled family, indexed by node type (built once per process), and the calls the
    families claim (:meth:`~tpu_agent.migrate.rules._base.Family.claim`), gathered from every family."""

    visit: Mapping[type, tuple[VisitFn, ...]]
    leave: Mapping[type, tuple[LeaveFn, ...]]
    references: tuple[tuple[str, str, RefFn], ...]  # (prefix, prefix + ".", handler), longest first
    claimed_calls: frozenset[str] = frozenset()
    # handler -> the code an internal error in it is reported under when it raised before naming a rule
    # (its family's first rule): every finding needs a rule code
    owners: Mapping[Callable[..., Any], str] = field(default_factory=dict)

    @classmethod
    def from_families(cls, families: list[Family]) -> Dispatch:
        visit: dict[type, list[VisitFn]] = {}
        leave: dict[type, list[LeaveFn]] = {}
        refs: list[tuple[str, str, RefFn]] = []
        claimed: set[str] = set()
        owners: dict[Callable[..., Any], str] = {}
        for family in families:
            claimed.update(family.claims)
            handlers: list[Callable[..., Any]] = [
                *(vh.fn for vh in family.visit_handlers),
                *(lh.fn for lh in family.leave_handlers),
                *(rh.fn for rh in family.reference_handlers),
            ]
            owners.update(dict.fromkeys(handlers, family.rules[0].code))
            for vh in family.visit_handlers:
                visit.setdefault(vh.node_type, []).append(vh.fn)
            for lh in family.leave_handlers:
                leave.setdefault(lh.node_type, []).append(lh.fn)
            refs.extend((rh.prefix, rh.prefix + ".", rh.fn) for rh in family.reference_handlers)
        refs.sort(key=lambda item: len(item[0]), reverse=True)
        return cls(
            {k: tuple(v) for k, v in visit.items()},
            {k: tuple(v) for k, v in leave.items()},
            tuple(refs),
            frozenset(claimed),
            owners,
        )

    def reference_handler(self, qualname: str) -> RefFn | None:
        for prefix, prefix_dot, fn in self.references:
            if qualname == prefix or qualname.startswith(prefix_dot):
                return fn
        return None
