"""Where a CUDA device or NCCL backend string goes: a small def-use analysis over one module.

A literal such as ``device = "cuda"`` or ``args.dist_backend = "nccl"`` is only safe to rewrite when every
place its value reaches is a device (or backend) position. This module answers that question per *key*: a
plain name (``device``), or an attribute name (``args.dist_backend``, ``cfg.device``, ``self.backend``: all
objects of the module that carry the attribute share one key, which is what config objects and argparse
namespaces need), with argparse ``add_argument("--dist-backend", default=...)`` defining the key of its
destination. Values assigned on to another name or passed by keyword are followed to that name's uses.

Why the stdlib ``ast`` and not libcst's ScopeProvider: the analysis runs only for files that bind such a
literal, but on a large tree that is most training scripts, and the stdlib parser plus one walk costs a
small fraction of libcst's metadata resolution (the migrate pass itself avoids libcst metadata for the same
reason). Scopes are approximated by name, which errs towards *mixed* (a report for a person), never towards
a rewrite: a key is a device key only when no use anywhere in the module is of another kind.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

_CUDA_RE = re.compile(r"cuda(?::\d+)?")
# positions whose argument is a device / a backend
_DEVICE_KEYWORDS = frozenset({"device", "map_location", "device_type", "device_id"})
# (set_device & co: `torch.cuda.set_device(device)` after `device = f"cuda:{rank}"` is nanoGPT's DDP setup)
_DEVICE_FIRST_FUNCS = frozenset(
    {
        "to",
        "device",
        "set_default_device",
        "init_device_mesh",
        "get_device_module",
        "Generator",
        "set_device",
        "set_device_index",
        "synchronize",
        "get_device_name",
        "get_device_properties",
        "get_device_capability",
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
    }
)
_BACKEND_KEYWORDS = frozenset({"backend"})
_BACKEND_FIRST_FUNCS = frozenset({"init_process_group", "new_group", "get_default_backend_for_device"})
_STR_METHODS = frozenset(
    {
        "startswith",
        "endswith",
        "split",
        "rsplit",
        "partition",
        "lower",
        "upper",
        "replace",
        "strip",
        "format",
        "find",
        "index",
        "count",
        "join",
        "encode",
    }
)
# calls whose arguments are only shown to people
_LOG_FUNCS = frozenset(
    {"print", "info", "debug", "warning", "warn", "error", "log", "exception", "critical", "str", "repr"}
)


class UseKind(str, Enum):
    DEVICE = "device"
    BACKEND = "backend"
    COMPARE = "compare"  # compared with a literal: the comparison is rewritten with the definition
    NEUTRAL = "neutral"  # printed, logged, formatted: any device or backend name serves
    OTHER = "other"  # anything else: a dict key, a return value, an argument of unknown meaning


class Verdict(str, Enum):
    DEVICE = "device"
    BACKEND = "backend"
    MIXED = "mixed"


@dataclass(frozen=True)
class KeyFlow:
    """What the module does with the values bound to one key."""

    verdict: Verdict | None
    other_lines: tuple[int, ...] = ()  # lines of the uses that are neither device/backend positions nor neutral
    position_lines: tuple[int, ...] = ()  # lines of the device/backend positions it reaches


@dataclass
class ValueFlow:
    """Per-key uses of one module, and the decision for each key."""

    uses: dict[str, list[tuple[UseKind, int]]] = field(default_factory=dict)
    follows: dict[str, set[str]] = field(default_factory=dict)  # key -> keys its value is copied into
    _cache: dict[str, KeyFlow] = field(default_factory=dict)

    def flow(self, key: str) -> KeyFlow:
        """The verdict for ``key``: DEVICE/BACKEND when every use is such a position (or neutral), MIXED when
        a device/backend position and another use meet, None when no device/backend position is reached."""
        if key in self._cache:
            return self._cache[key]
        kinds: dict[UseKind, list[int]] = {}
        for kind, line in self._reached(key):
            kinds.setdefault(kind, []).append(line)
        positions = sorted({*kinds.get(UseKind.DEVICE, []), *kinds.get(UseKind.BACKEND, [])})
        other = tuple(sorted(set(kinds.get(UseKind.OTHER, []))))
        verdict: Verdict | None = None
        if UseKind.DEVICE in kinds and UseKind.BACKEND in kinds:
            verdict = Verdict.MIXED
        elif UseKind.DEVICE in kinds or UseKind.BACKEND in kinds:
            if other:
                verdict = Verdict.MIXED
            else:
                verdict = Verdict.DEVICE if UseKind.DEVICE in kinds else Verdict.BACKEND
        result = KeyFlow(verdict, other, tuple(positions))
        self._cache[key] = result
        return result

    def _reached(self, key: str) -> Iterator[tuple[UseKind, int]]:
        seen = {key}
        stack = [key]
        while stack:
            current = stack.pop()
            yield from self.uses.get(current, ())
            for nxt in self.follows.get(current, ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)


def name_key(name: str) -> str:
    return f"name:{name}"


def attr_key(attr: str) -> str:
    return f"attr:{attr}"


def target_key(node: ast.expr) -> str | None:
    """The key an assignment target binds: ``x`` -> name:x, ``a.b.x`` -> attr:x; else None."""
    if isinstance(node, ast.Name):
        return name_key(node.id)
    if isinstance(node, ast.Attribute):
        return attr_key(node.attr)
    return None


def argparse_dest(flags: list[str], dest: str | None) -> str | None:
    """The attribute an ``add_argument`` call sets: ``dest=`` or the first long flag, dashes as underscores."""
    if dest:
        return dest
    longs = [f for f in flags if f.startswith("--")]
    chosen = longs[0][2:] if longs else (flags[0].lstrip("-") if flags else "")
    return chosen.replace("-", "_") or None


def analyse(source: str, tree: ast.Module | None = None) -> ValueFlow:
    """The uses of every name and attribute of ``source`` (or of its already parsed ``tree``); an empty flow
    when it does not parse."""
    flow = ValueFlow()
    if tree is None:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return flow
    # One walk carrying each node's parent and grandparent (cheaper than a parent map of every node). It runs
    # on most training scripts, so it reads the fields itself: the children ``ast.iter_child_nodes`` yields,
    # at a fraction of that generator's cost.
    stack: list[tuple[ast.AST, ast.AST | None, ast.AST | None]] = [(tree, None, None)]
    pop, push, node_type = stack.pop, stack.append, ast.AST
    while stack:
        node, parent, grand = pop()
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, node_type):
                        push((item, node, parent))
            elif isinstance(value, node_type):
                push((value, node, parent))
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            key = name_key(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            key = attr_key(node.attr)
        else:
            continue
        kind, follow = _classify(node, parent, grand)
        if follow is not None:
            flow.follows.setdefault(key, set()).add(follow)
        elif kind is not None:
            flow.uses.setdefault(key, []).append((kind, node.lineno))
    return flow


def call_name(call: ast.Call) -> str | None:
    """The last name of the called function: ``init_process_group`` for ``dist.init_process_group(...)``."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _classify(node: ast.expr, parent: ast.AST | None, grand: ast.AST | None) -> tuple[UseKind | None, str | None]:
    """(kind of use, None) or (None, key the value is copied into); (None, None) for no use (``x.attr``)."""
    if isinstance(parent, ast.Attribute):
        # `dev.startswith("cuda")` tests the value as a comparison with "cuda" does (and is rewritten with it);
        # other string methods, and other prefixes (`backend.startswith("nc")`), read its text; `device.type`, `args.device`: the node is an object holding the
        # value (the attribute is its own key)
        if parent.attr == "startswith" and _called_with_cuda(parent, grand):
            return UseKind.COMPARE, None
        return (UseKind.OTHER, None) if parent.attr in _STR_METHODS else (None, None)
    if isinstance(parent, ast.keyword):
        name = call_name(grand) if isinstance(grand, ast.Call) else None
        if parent.arg in _DEVICE_KEYWORDS:
            return UseKind.DEVICE, None
        if parent.arg in _BACKEND_KEYWORDS:
            return UseKind.BACKEND, None
        if name in _LOG_FUNCS:
            return UseKind.NEUTRAL, None
        if parent.arg is not None:
            return None, name_key(parent.arg)  # passed by keyword: the parameter of that name carries it on
        return UseKind.OTHER, None
    if isinstance(parent, ast.Call) and node is parent.func:
        return None, None  # `torch.device(...)` calls a function of that name: not a use of a `device` value
    if isinstance(parent, ast.Call):
        name = call_name(parent)
        first = bool(parent.args) and parent.args[0] is node
        if first and name in _DEVICE_FIRST_FUNCS:
            return UseKind.DEVICE, None
        if first and name in _BACKEND_FIRST_FUNCS:
            return UseKind.BACKEND, None
        if name in _LOG_FUNCS:
            return UseKind.NEUTRAL, None
        return UseKind.OTHER, None
    if isinstance(parent, ast.Compare):
        sides = [parent.left, *parent.comparators]
        if any(_is_string_literal(s) for s in sides if s is not node):
            return UseKind.COMPARE, None
        return UseKind.OTHER, None
    if isinstance(parent, (ast.FormattedValue, ast.JoinedStr)):
        return UseKind.NEUTRAL, None
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mod) and parent.right is node:
        return UseKind.NEUTRAL, None  # "%s" % device
    if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node:
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        keys = [target_key(t) for t in targets]
        if len(keys) == 1 and keys[0] is not None:
            return None, keys[0]
        return UseKind.OTHER, None
    if isinstance(parent, ast.IfExp) and parent.test is not node:
        if isinstance(grand, (ast.Assign, ast.AnnAssign)):
            targets = grand.targets if isinstance(grand, ast.Assign) else [grand.target]
            if len(targets) == 1 and (key := target_key(targets[0])) is not None:
                return None, key
        return UseKind.OTHER, None
    if isinstance(parent, (ast.If, ast.While, ast.BoolOp, ast.UnaryOp)):
        return UseKind.NEUTRAL, None  # truthiness of a non-empty string does not depend on its text
    return UseKind.OTHER, None


def _is_string_literal(node: ast.expr) -> bool:
    """A string constant, or a tuple, list or set of them (``device in ("cuda", "mps")`` compares the value
    with literals as ``device == "cuda"`` does)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_string_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _called_with_cuda(method: ast.Attribute, call: ast.AST | None) -> bool:
    """``method`` is called with the one argument ``"cuda"``: ``x.startswith("cuda")``."""
    return (
        isinstance(call, ast.Call)
        and call.func is method
        and not call.keywords
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Constant)
        and call.args[0].value == "cuda"
    )


def is_cuda_literal(value: object) -> bool:
    return isinstance(value, str) and _CUDA_RE.fullmatch(value) is not None
