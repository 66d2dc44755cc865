"""One owner per fact: a name that once meant two things (or a fact typed in two modules that then drifted
apart) has at most one top-level definition in the package, and TorchTPU's eager-mode variables are spelt in
one module only.

Issue 29 found two eager-mode parsers that disagreed, ``EagerMode`` as both a dataclass and an enum, estimate's
``MAX_STEPS`` meaning something else than profile's, and ``ERROR_SHARE`` a fraction in one rule and a percent
in another. Each now has one definition; this test keeps it so.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "tpu_agent"

# Names with one meaning each, and the owner that defines it.
SINGLE_OWNER = {
    "EagerMode": "runtime/emulated/state.py",  # TorchTPU's enum; the --eager-mode record is EagerModeOption
    "EagerModeOption": "runtime/envvars.py",
    "EAGER_MODES": "runtime/envvars.py",
    "eager_mode_from_env": "runtime/envvars.py",
    "debug_checks_from_env": "runtime/envvars.py",
    "EnvSwitch": "runtime/envvars.py",
    "LAUNCH_BLOCKING": "runtime/envvars.py",
    "DEFER_AND_FUSE": "runtime/envvars.py",
    "DEBUG_CHECKS": "runtime/envvars.py",
    "DEFAULT_STEPS": "profile/options.py",  # measured steps; estimate's are DEFAULT_OPTIMIZER_STEPS
    "MAX_STEPS": "profile/options.py",
    "DEFAULT_OPTIMIZER_STEPS": "estimate/options.py",
    "MIN_OPTIMIZER_STEPS": "estimate/options.py",
    "MAX_OPTIMIZER_STEPS": "estimate/options.py",
    "STRATEGIES": "estimate/options.py",
    "DEFAULT_TARGET": "estimate/options.py",
    "DEFAULT_MAX_PARAMETERS": "check/api.py",
    "DEFAULT_TIMEOUT_S": "check/api.py",
    "MIN_TIMEOUT_S": "check/api.py",
    "DEFAULT_CHIP": "chips.py",
    "_GRIDS_2D": "chips.py",  # slice layouts: the chip table's, read by estimate/compiler.py
    "_GRIDS_3D": "chips.py",
    "ERROR_SHARE": "profile/rules/ip_input_bound.py",  # a fraction of the step; _sync's percent is ERROR_SAVING_PCT
    "Estimate": "profile/model.py",  # the profile's roofline; estimate's compiled one is CompiledEstimate
    "CompiledEstimate": "estimate/model.py",
    "MemoryBreakdown": "profile/model.py",  # state per device; the compiler's HBM by kind is HbmBreakdown
    "HbmBreakdown": "estimate/model.py",
}
# TorchTPU's eager-mode and debug-check variables: read through runtime/envvars.py, so spelt nowhere else. The
# migrate codemod writes the new name into user code (a layer below the runtime), hence its exception.
EAGER_VARIABLES = {
    "TORCH_TPU_LAUNCH_BLOCKING",
    "TPU_LAUNCH_BLOCKING",
    "TORCH_TPU_DEFER_AND_FUSE",
    "TPU_DEFER_AND_FUSE",
    "TORCH_TPU_ENABLE_DEBUG_CHECKS",
    "TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS",
}
VARIABLE_OWNER = "runtime/envvars.py"
VARIABLE_EXCEPTIONS = ("migrate/",)


def _top_level_names(tree: ast.Module) -> list[str]:
    """Names a module defines at its top level: classes, functions and assigned names (also under ``if``/``try``)."""
    names: list[str] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names.extend(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
        elif isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body + node.orelse + getattr(node, "finalbody", []))
    return names


def _modules() -> dict[str, ast.Module]:
    return {
        path.relative_to(PACKAGE_ROOT).as_posix(): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE_ROOT.rglob("*.py"))
    }


def test_each_fact_has_one_top_level_definition_in_its_owner() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for module, tree in _modules().items():
        for name in _top_level_names(tree):
            if name in SINGLE_OWNER:
                where[name].append(module)
    wrong = {name: where[name] for name, owner in SINGLE_OWNER.items() if where[name] != [owner]}
    assert not wrong, f"defined elsewhere than (or besides) its one owner: {wrong}"


def test_eager_mode_variables_are_spelt_only_by_their_reader() -> None:
    spelt: dict[str, set[str]] = defaultdict(set)
    for module, tree in _modules().items():
        if module == VARIABLE_OWNER or module.startswith(VARIABLE_EXCEPTIONS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in EAGER_VARIABLES:
                spelt[module].add(node.value)
    assert not spelt, f"import the switch from tpu_agent.runtime.envvars instead: {dict(spelt)}"
