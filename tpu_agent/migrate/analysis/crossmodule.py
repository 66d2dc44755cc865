"""Where a module-level ``"cuda"`` / ``"nccl"`` constant goes after other modules of the tree import it.

:mod:`~tpu_agent.migrate.analysis.valueflow` follows a value within one module. A constant defined in
``config.py`` (``ACCEL = "cuda"``) is often only *used* elsewhere: ``from config import ACCEL`` then
``model.to(ACCEL)``, or ``import config`` then ``torch.device(config.ACCEL)``. Before the files are migrated,
:func:`imported_uses` finds such constants in the given files, the files that import them (``from m import X``,
``from . import m`` / ``import m`` then ``m.X``; absolute or relative, resolved against the files' directories),
and what each importer does with the imported name, so that the definition is rewritten when every use in
every module is a device (backend) position, and reported with the places it reaches when uses are mixed.

Cheap by construction: a bytes regex finds the candidate definitions (most trees have a handful), and only
files that mention both a defined name and its module's name are parsed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tpu_agent.migrate.analysis.astnodes import nodes
from tpu_agent.migrate.analysis.valueflow import KeyFlow, Verdict, analyse, attr_key, name_key

# a module-level (column 0) ``NAME = "cuda"`` / ``NAME: str = "nccl"``
_DEFINITION_RE = re.compile(
    rb"^([A-Za-z_]\w*)[ \t]*(?::[^=\n]+)?=[ \t]*[rRuU]?([\"'])(?:cuda(?::\d+)?|nccl)\2[ \t]*(?:#.*)?$", re.MULTILINE
)


@dataclass(frozen=True)
class PythonFile:
    path: Path  # absolute
    display: str
    data: bytes


@dataclass(frozen=True)
class ImportedFlow:
    """What one importing module does with an imported constant."""

    display: str  # the importing file, as reports show it
    flow: KeyFlow


def definitions(files: Sequence[PythonFile]) -> dict[Path, set[str]]:
    """Per file that defines any: its module-level ``"cuda"``/``"nccl"`` constants (a bytes regex, no parse). Only
    these files receive :func:`imported_uses`, so the others can be migrated before that scan is done."""
    found: dict[Path, set[str]] = {}
    for file in files:
        names = {m.group(1).decode() for m in _DEFINITION_RE.finditer(file.data)}
        if names:
            found[file.path] = names
    return found


def imported_uses(
    files: Sequence[PythonFile], defined: dict[Path, set[str]] | None = None
) -> dict[Path, dict[str, tuple[ImportedFlow, ...]]]:
    """Per defining file: its constant's analysis key (``name:X``) -> the flows of the modules importing it.
    ``defined``: :func:`definitions` of ``files`` when the caller has them already."""
    constants = definitions(files) if defined is None else defined
    if not constants:
        return {}
    found: dict[Path, dict[str, list[ImportedFlow]]] = {}
    for file in files:
        wanted = {
            path: names
            for path, names in constants.items()
            if path != file.path
            and path.stem.encode() in file.data
            and any(name.encode() in file.data for name in names)
        }
        if not wanted:
            continue
        try:
            source = file.data.decode("utf-8")
            tree = ast.parse(source)
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
            continue  # the file's own migration reports it; it cannot tell us anything here
        bindings = list(_bindings(tree, file.path, wanted))
        if not bindings:
            continue
        flow = analyse(source, tree)
        for defining, name, key in bindings:
            found.setdefault(defining, {}).setdefault(name_key(name), []).append(
                ImportedFlow(file.display, flow.flow(key))
            )
    return {path: {key: tuple(flows) for key, flows in keys.items()} for path, keys in found.items()}


def _bindings(tree: ast.Module, importer: Path, wanted: dict[Path, set[str]]) -> list[tuple[Path, str, str]]:
    """(defining file, constant, key of its uses in the importer) for every import of a wanted constant."""
    out: list[tuple[Path, str, str]] = []
    for node in nodes(tree):
        if isinstance(node, ast.ImportFrom):
            base = _module_path(importer, node.module, node.level)
            for alias in node.names:
                bound = alias.asname or alias.name
                for path, names in wanted.items():
                    if alias.name in names and _is_module(path, base):
                        out.append((path, alias.name, name_key(bound)))  # from config import ACCEL
                    elif _is_module(path, [*base, alias.name]):  # from pkg import config; config.ACCEL
                        out.extend((path, name, attr_key(name)) for name in names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                for path, names in wanted.items():
                    if _is_module(path, alias.name.split(".")):  # import config; config.ACCEL
                        out.extend((path, name, attr_key(name)) for name in names)
    return out


def _module_path(importer: Path, module: str | None, level: int) -> list[str]:
    """The imported module as path components: relative imports resolved against the importer's directory
    (``..pkg`` -> the parent directory's ``pkg``), absolute ones as written."""
    parts = module.split(".") if module else []
    if level == 0:
        return parts
    directory = importer.parent
    for _ in range(level - 1):
        directory = directory.parent
    return [*directory.parts, *parts]


def _is_module(path: Path, parts: list[str]) -> bool:
    """Whether ``path`` (``.../pkg/config.py`` or ``.../config/__init__.py``) is the module ``parts`` names: its
    trailing components are those parts (absolute imports resolve against any directory of the tree)."""
    if not parts:
        return False
    own = list(path.parent.parts) if path.name == "__init__.py" else [*path.parent.parts, path.stem]
    return len(own) >= len(parts) and own[len(own) - len(parts) :] == parts


def merged(local: KeyFlow, imported: Sequence[ImportedFlow]) -> tuple[Verdict | None, list[str]]:
    """The verdict for a constant used in its own module (``local``) and in the modules importing it, and the
    other uses as places (``line 4``, ``train.py:12``) for a report. A use that is no device/backend position
    anywhere makes device positions anywhere *mixed*."""
    flows = [local, *(item.flow for item in imported)]
    kinds = {f.verdict for f in flows if f.verdict is not None}
    others = [f"line {line}" for line in local.other_lines] + [
        f"{item.display}:{line}" for item in imported for line in item.flow.other_lines
    ]
    if not kinds:
        return None, others
    if Verdict.MIXED in kinds or len(kinds) > 1 or others:
        return Verdict.MIXED, others
    return kinds.pop(), others
