"""CUDA-to-TorchTPU API lookup, answered from the migration rule records and the emulation's torch_tpu surface.

Every CUDA row is one :class:`~tpu_agent.migrate.model.ApiEquivalent` of one rule (``Rule.apis``): what the CUDA
API becomes, with the rule's safety as the status, its references and the oldest torch that has the emitted API.
There is no second table: what ``tpu_lookup_api`` says about an API is what ``tpu-agent migrate`` does to it,
so the two can never disagree. TorchTPU's own Python API (``OpTracer``, ``set_eager_mode``, ``api.tpu_device``)
comes from the public names of the emulation's ``torch_tpu`` package itself, read from its source (importing it
would activate the device), so a row exists exactly when ``tpu-agent run`` provides the name. The ``torch.tpu``
and ``torch.backends.tpu`` modules TorchTPU installs are read the same way from the classes the emulation builds
them from (``TpuModule``, ``BackendsTpu``): the legacy CUDA-style calls there say that they are internal and what
replaces them, as the 0.2.0 wheel does. This module only flattens the rows and ranks them against a query such as
``torch.cuda.synchronize``, ``GradScaler``, ``OpTracer`` or ``allow_excess_precision``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

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
EMULATED = (
    "emulated",
    "TorchTPU's own API (no CUDA counterpart): tpu-agent run provides it where torch_tpu is not installed, as a "
    "face over the emulated device (docs/torchtpu-fidelity.md says how closely)",
)
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


def _public_names(tree: ast.Module) -> list[str]:
    """A module's ``__all__`` (its public surface), else its public top-level functions and classes."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [str(ast.literal_eval(item)) for item in getattr(node.value, "elts", [])]
    return [
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")
    ]


def _first_line(text: str | None) -> str:
    return (text or "").strip().split("\n\n")[0].replace("\n", " ")


def surface_rows(package: Path) -> tuple[ApiMapping, ...]:
    """One row per public name of the emulation's ``torch_tpu`` package, from its source (nothing is imported).

    A module's ``GUIDE_PAGE`` names the TorchTPU notebook that documents it; the note is the name's docstring
    (the module's, for names defined elsewhere, such as the execution-mode properties)."""
    from tpu_agent.migrate.rules.references import torch_tpu_notebook

    rows = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parts = path.relative_to(package.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        assigned = {
            t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
        }
        page = assigned.get("GUIDE_PAGE")
        if page is None:
            continue  # a package marker or re-export: its names are listed where they are defined
        defined = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for name in _public_names(tree):
            node = defined.get(name)
            doc = ast.get_docstring(node) if node is not None else ast.get_docstring(tree)
            rows.append(
                ApiMapping(
                    cuda="",
                    tpu=f"{module}.{name}",
                    status=EMULATED[0],
                    note=f"{module}.{name}: {_first_line(doc)}",
                    reference=torch_tpu_notebook(str(ast.literal_eval(page))),
                    keywords=tuple(sorted({name, *(p for p in module.split(".") if len(p) > 2)})),
                    rule="",
                )
            )
    return tuple(rows)


# The guide page that documents each torch.tpu name (api_mapping, where most of them are, when not listed), and
# the underscored names the guide itself calls, which are therefore part of the surface users write against.
TORCH_TPU_PAGES = {
    "EagerMode": "eager_mode",
    "eager_mode": "eager_mode",
    "set_eager_mode": "eager_mode",
    "enable_cpu_fallback": "error_glossary",
    "Precision": "precision_management",
    "precision": "precision_management",
    "allow_excess_precision": "precision_management",
    "_clear_cache": "precision_management",
    "_get_cache_stats": "compilation_cache",
    "_hbm_usage_summary": "api_mapping",
}


def _decorator_call(node: ast.FunctionDef, name: str) -> str | None:
    """The string argument of a ``@name("...")`` decorator on ``node``, None when it has none."""
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name) and decorator.func.id == name:
            return str(ast.literal_eval(decorator.args[0]))
    return None


def _class_members(path: Path, class_name: str) -> list[tuple[str, ast.AST]]:
    """(name, node) of each attribute, method, property and nested class the class body of ``class_name`` defines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (body,) = [n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    members: list[tuple[str, ast.AST]] = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            members.append((node.name, node))
        elif isinstance(node, ast.Assign):
            members.extend((t.id, node) for t in node.targets if isinstance(t, ast.Name))
    return members


def module_rows(module: str, members: list[tuple[str, ast.AST]]) -> tuple[ApiMapping, ...]:
    """One row per name of an installed module (``torch.tpu``) from the class it is built from: its public names
    and the underscored ones the guide calls. A legacy call marked ``@internal("torch.accelerator.X")`` says so."""
    from tpu_agent.migrate.rules.references import torch_tpu_notebook

    rows, seen = [], set()
    for name, node in members:
        if name in seen or (name.startswith("_") and name not in TORCH_TPU_PAGES):
            continue
        seen.add(name)
        doc = _first_line(ast.get_docstring(node)) if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ""
        prefer = _decorator_call(node, "internal") if isinstance(node, ast.FunctionDef) else None
        if prefer is not None:
            doc = (
                f"internal to TorchTPU with torch >= 2.11: called from user code it raises RuntimeError "
                f"(TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1 makes it warn once); use {prefer}. {doc}".strip()
            )
        rows.append(
            ApiMapping(
                cuda="",
                tpu=f"{module}.{name}",
                status=EMULATED[0],
                note=f"{module}.{name}: {doc or 'provided by the emulation as TorchTPU 0.2.0 has it'}",
                reference=torch_tpu_notebook(TORCH_TPU_PAGES.get(name, "api_mapping")),
                keywords=tuple(sorted({name, name.lstrip("_"), *(p for p in module.split(".") if len(p) > 2)})),
                rule="",
            )
        )
    return tuple(rows)


@lru_cache(maxsize=1)
def load_table() -> tuple[dict[str, str], tuple[ApiMapping, ...]]:
    """(status legend, rows): every rule's ``apis`` in code order, then the torch_tpu surface's names, then
    ``torch.tpu``'s (with the eager-mode settings it shares with ``execution_mode``) and ``torch.backends.tpu``'s."""
    from tpu_agent.migrate.rules import ALL_RULES
    from tpu_agent.runtime.run_scope import SURFACE_DIR

    rows = tuple(_row(rule, i) for _, rule in sorted(ALL_RULES.items()) for i in range(len(rule.apis)))
    emulated = SURFACE_DIR.parent  # read, not imported: importing these modules imports torch
    torch_tpu = _class_members(emulated / "tpu_module.py", "TpuModule")
    settings = _class_members(emulated / "modes.py", "ExecutionSettings")
    backends = _class_members(emulated / "backends_tpu.py", "BackendsTpu")
    return dict([*STATUSES.values(), EMULATED]), (
        rows
        + surface_rows(SURFACE_DIR / "torch_tpu")
        + module_rows("torch.tpu", torch_tpu + settings)
        + module_rows("torch.backends.tpu", backends)
    )


def _tokens(text: str) -> set[str]:
    return {t for t in re.split(r"[^a-z0-9_]+", text.lower()) if len(t) > 1 and t not in {"torch", "cuda"}}


def _score(query: str, row: ApiMapping) -> float:
    q = query.lower().strip()
    bare = q.removeprefix("torch.cuda.").removeprefix("torch.").rstrip("()")
    score = 0.0
    api = (row.cuda or row.tpu).lower()  # a CUDA row matches on its CUDA API, a torch_tpu row on its own name
    if q and q in api:
        score += 10
    elif bare and bare in api:
        score += 6
    for keyword in row.keywords:
        k = keyword.lower()
        if k == bare or k == q:
            score += 5
        elif k in q:
            score += 2
    shared = _tokens(query) & (_tokens(api) | {k.lower() for k in row.keywords})
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
            f"no CUDA API covered by the migration rules, and no torch_tpu API, matches {query!r}",
            "Try the bare name (e.g. 'synchronize', 'GradScaler', 'nccl'), run `tpu-agent rules` for the catalogue, "
            "or call tpu_scan to find CUDA usages with the rule that covers them.",
        )
    return [row for _, _, row in scored[:limit]]


__all__ = [
    "EMULATED",
    "STATUSES",
    "TORCH_TPU_PAGES",
    "ApiMapping",
    "load_table",
    "lookup",
    "module_rows",
    "surface_rows",
]
