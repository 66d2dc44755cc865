"""Device and backend strings followed from their definition to their uses (TPU101/TPU401 fixes, TPU108/TPU408).

The call-site rules see ``"cuda"`` where it is passed; this module handles the literal where it is *defined*
(``DEV = "cuda"``, ``args.dist_backend = "nccl"``, ``parser.add_argument("--accel", default="cuda")``,
``backend = "gloo" if not torch.cuda.is_available() else "nccl"``) by asking
:mod:`tpu_agent.migrate.analysis.valueflow` where the value goes. Every use a device (backend) position:
rewritten, with comparisons against the literal (``if dev == "cuda":``, ``"cuda" in dev``) rewritten with it
so that they keep their meaning. Device positions mixed with other uses (a dict key, an argument of unknown
meaning): reported for a person with the lines it reaches. Names whose own name says device or backend are
already rewritten by the call-site families; this module does not report them twice.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.analysis.crossmodule import merged
from tpu_agent.migrate.analysis.valueflow import KeyFlow, Verdict, argparse_dest, attr_key, name_key
from tpu_agent.migrate.cstnodes import walk
from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules import devices, distributed
from tpu_agent.migrate.rules._backend import fix_backend_value, is_nccl_backend
from tpu_agent.migrate.rules._base import Family
from tpu_agent.migrate.rules._bound import key_of
from tpu_agent.migrate.rules._cst import (
    keep_parens,
    keyword,
    replace_arg_value,
    source,
    string_value,
    updated_index,
)
from tpu_agent.migrate.rules.devices import DEVICE_VAR_RE, cuda_device_code, rewrite_device
from tpu_agent.migrate.rules.references import ACCELERATOR, DISTRIBUTED

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

devices.FAMILY.rule(
    code="TPU108",
    name="cuda-value-mixed-uses",
    safety=Safety.MANUAL,
    summary='A "cuda" value that reaches device positions and other uses (a dict key, an unknown call).',
    rationale="The literal can only become the accelerator's device type when every place it reaches takes any "
    "device; where it also selects behaviour by its exact text (a lookup table, a comparison tool cannot see), "
    "a person decides. The report lists the lines it reaches.",
    before='dev = "cuda"\nmodel.to(dev)\nkernels = {"cuda": fused, "cpu": plain}[dev]',
    after="# TODO(tpu-agent TPU108): decide per use; the device positions take DEVICE.type",
    references=(ACCELERATOR,),
    apis=(ApiEquivalent('dev = "cuda" used as a device and as a lookup key', "DEVICE.type at the device uses"),),
)
distributed.FAMILY.rule(
    code="TPU408",
    name="nccl-value-mixed-uses",
    safety=Safety.MANUAL,
    summary='A "nccl" value that reaches backend positions and other uses.',
    rationale="The backend name can only become the accelerator's default backend when every place it reaches is a "
    "process-group backend; other uses (a lookup, a string test the tool cannot see) need a person.",
    before='BACKEND = "nccl"\ndist.init_process_group(BACKEND)\nuse_nccl_tricks(BACKEND)',
    after="# TODO(tpu-agent TPU408): pass torch.distributed.get_default_backend_for_device(DEVICE) where a backend is "
    "expected",
    references=(f"{DISTRIBUTED}#torch.distributed.get_default_backend_for_device",),
    apis=(
        ApiEquivalent(
            'backend = "nccl" used as a backend and elsewhere',
            "torch.distributed.get_default_backend_for_device(DEVICE) at the backend uses",
        ),
    ),
)

_NAMED_BACKEND_RE = re.compile(r"backend$", re.IGNORECASE)


DefinitionRewrite = Callable[
    ["PyContext", cst.BaseExpression, cst.BaseExpression, cst.BaseExpression], cst.BaseExpression | None
]


def _register_definition(family: Family, rewrite: DefinitionRewrite) -> None:
    """Run ``rewrite(ctx, target, original value, updated value)`` on every single-target ``x = ...`` and
    ``x: T = ...`` of ``family``: device and backend definitions are found the same way."""

    def assign(ctx: PyContext, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if len(original.targets) != 1:
            return updated
        new = rewrite(ctx, original.targets[0].target, original.value, updated.value)
        return updated.with_changes(value=new) if new is not None else updated

    def annotated(ctx: PyContext, original: cst.AnnAssign, updated: cst.AnnAssign) -> cst.AnnAssign:
        if original.value is None or updated.value is None:
            return updated
        new = rewrite(ctx, original.target, original.value, updated.value)
        return updated.with_changes(value=new) if new is not None else updated

    family.leave(cst.Assign)(assign)
    family.leave(cst.AnnAssign)(annotated)


def _holds_string(ctx: PyContext, node: cst.CSTNode, text: str) -> bool:
    """Some string literal inside ``node`` contains ``text`` (a search that builds nothing: it runs on every
    assigned value of a file that mentions the text)."""
    if not ctx.mentions(text):
        return False
    return any(type(inner) is cst.SimpleString and text in inner.value for inner in walk(node))


def _lines(flow: KeyFlow) -> str:
    shown = ", ".join(str(n) for n in flow.other_lines[:8])
    return f"line{'s' if len(flow.other_lines) > 1 else ''} {shown}" if shown else "other uses"


def _definition_flow(ctx: PyContext, key: str) -> tuple[Verdict | None, str]:
    """The verdict for the value a definition binds to ``key``, and its other uses for a report. A module-level
    constant counts what the tree's modules importing it do with it too."""
    local = ctx.value_flow.flow(key)
    imported = ctx.imported_flows.get(key, ()) if len(ctx.stmt_stack) == 1 else ()
    if not imported:
        return local.verdict, _lines(local)
    verdict, places = merged(local, imported)
    return verdict, ", ".join(places[:8]) or "other uses"


# ---- devices ------------------------------------------------------------------------------------------
def _device_definition(
    ctx: PyContext, target: cst.BaseExpression, original: cst.BaseExpression, updated: cst.BaseExpression
) -> cst.BaseExpression | None:
    key = key_of(target)
    if key is None or cuda_device_code(ctx, original) is None or cuda_device_code(ctx, updated) is None:
        return None  # not a CUDA literal, or the name-based rule already rewrote it
    verdict, others = _definition_flow(ctx, key[0])
    if verdict is Verdict.DEVICE and not DEVICE_VAR_RE.search(key[1]):
        return rewrite_device(ctx, original, "type", updated=updated)
    if verdict is Verdict.MIXED:
        ctx.report("TPU108", original, f"{key[1]} = {source(original)} is used as a device and by {others}")
    return None


_register_definition(devices.FAMILY, _device_definition)


# ---- backends -----------------------------------------------------------------------------------------
def _backend_definition(
    ctx: PyContext, target: cst.BaseExpression, original: cst.BaseExpression, updated: cst.BaseExpression
) -> cst.BaseExpression | None:
    key = key_of(target)
    if key is None or not _holds_string(ctx, original, "nccl"):
        return None
    if not updated.deep_equals(original):
        return None  # the name-based rule already rewrote it
    verdict, others = _definition_flow(ctx, key[0])
    if verdict is Verdict.MIXED:
        ctx.report("TPU408", original, f"{key[1]} = {source(original)} is used as a backend and by {others}")
        return None
    if verdict is not Verdict.BACKEND and not _NAMED_BACKEND_RE.search(key[1]):
        return None
    if not is_nccl_backend(ctx, original):
        return None
    return fix_backend_value(ctx, original, updated)


_register_definition(distributed.FAMILY, _backend_definition)


@distributed.FAMILY.leave(cst.Subscript)
def backend_table(ctx: PyContext, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
    # {"cuda": "nccl", "cpu": "gloo"}[device.type]: the table torch keeps for every accelerator
    table = original.value
    if (
        not isinstance(table, cst.Dict)
        or len(original.slice) != 1
        or not isinstance(original.slice[0].slice, cst.Index)
    ):
        return updated
    pairs = {string_value(el.key): string_value(el.value) for el in table.elements if isinstance(el, cst.DictElement)}
    if pairs.get("cuda") != "nccl" or len(pairs) != len(table.elements) or not set(pairs.values()) <= {"nccl", "gloo"}:
        return updated
    index = updated.slice[0].slice.value  # type: ignore[attr-defined]

    def build() -> cst.BaseExpression:
        if ctx.target.value == "tpu":
            entry = cst.DictElement(key=ctx.string("tpu"), value=ctx.default_backend())
            return updated.with_changes(value=updated.value.with_changes(elements=[*updated.value.elements, entry]))  # type: ignore[attr-defined]
        return cst.Call(func=ctx.torch_attr("distributed.get_default_backend_for_device"), args=[cst.Arg(index)])

    if ctx.target.value == "tpu" and "tpu" in pairs:
        return updated
    new = ctx.fix("TPU401", original, build, lambda n: f"backend table {source(original)} -> {source(n)}")
    return keep_parens(original, new) if new is not None else updated


def _is_device_or_backend(ctx: PyContext, node: cst.BaseExpression) -> bool:
    return cuda_device_code(ctx, node) is not None or is_nccl_backend(ctx, node)


# ---- argparse options ---------------------------------------------------------------------------------
@devices.FAMILY.leave(cst.Call)
def argparse_option(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    """``add_argument`` defaults and choices followed through the option's destination."""
    if type(updated) is not cst.Call or not (
        isinstance(original.func, cst.Attribute) and original.func.attr.value == "add_argument"
    ):
        return updated
    default = keyword(original, "default")
    choices = keyword(original, "choices")
    if not (default is not None and _is_device_or_backend(ctx, default.value)) and not (
        choices is not None and "cuda" in source(choices.value)
    ):
        return updated  # most options: no device or backend literal, no analysis needed
    flags = [string_value(a.value) or "" for a in original.args if a.keyword is None]
    dest_arg = keyword(original, "dest")
    dest = argparse_dest(flags, string_value(dest_arg.value) if dest_arg is not None else None)
    if dest is None:
        return updated
    verdict = ctx.value_flow.flow(attr_key(dest)).verdict
    named_device = any("device" in f for f in flags)
    result = updated
    position = updated_index(original, updated, default) if default is not None else -1
    if default is not None and not named_device and cuda_device_code(ctx, default.value):
        if verdict is Verdict.DEVICE:
            new = rewrite_device(ctx, default.value, "type", updated=updated.args[position].value)
            if new is not None:
                result = replace_arg_value(result, position, new)
        elif verdict is Verdict.MIXED:
            ctx.report(
                "TPU108",
                default.value,
                f"--{dest} default {source(default.value)} is used as a device and by "
                f"{_lines(ctx.value_flow.flow(attr_key(dest)))}",
            )
    if default is not None and not any("backend" in f for f in flags) and is_nccl_backend(ctx, default.value):
        new = _backend_definition(
            ctx, cst.Attribute(value=cst.Name("args"), attr=cst.Name(dest)), default.value, updated.args[position].value
        )
        if new is not None:
            result = replace_arg_value(result, position, new)
    if (
        choices is not None
        and isinstance(choices.value, (cst.List, cst.Tuple, cst.Set))
        and (named_device or verdict is Verdict.DEVICE)
    ):
        result = _device_choices(ctx, original, result, choices)
    return result


def _device_choices(ctx: PyContext, original: cst.Call, updated: cst.Call, choices: cst.Arg) -> cst.Call:
    # choices=["cpu", "cuda"] -> ["cpu", DEVICE.type]: the default the device rules wrote stays a valid choice
    position = updated_index(original, updated, choices)
    elements = list(updated.args[position].value.elements)  # type: ignore[attr-defined]
    if any(string_value(el.value) == ("tpu" if ctx.target.value == "tpu" else "") for el in elements):
        return updated
    changed = False
    for j, el in enumerate(choices.value.elements):  # type: ignore[attr-defined]
        if string_value(el.value) == "cuda":
            new = ctx.fix(
                "TPU101",
                el.value,
                functools.partial(ctx.device_type, el.value),
                lambda n: f'choice "cuda" -> {source(n)}',
            )
            if new is not None:
                elements[j] = elements[j].with_changes(value=new)
                changed = True
    if not changed:
        return updated
    return replace_arg_value(updated, position, updated.args[position].value.with_changes(elements=elements))


@devices.FAMILY.leave(cst.Call)
def device_parameter_argument(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    """``create_model(cfg, "cuda", dtype)`` calling a function of this module defined once as ``def
    create_model(cfg, device="cuda", dtype=...)``: a CUDA literal passed by position to a parameter whose name says
    device is a device value, as it is when passed as ``device="cuda"``."""
    tree = ctx.ast_tree
    if tree is None or not isinstance(original.func, cst.Name):
        return updated
    literals = [
        (i, arg)
        for i, arg in enumerate(original.args)
        if arg.keyword is None and not arg.star and cuda_device_code(ctx, arg.value)
    ]
    if not literals or any(arg.star for arg in original.args[: literals[-1][0]]):
        return updated
    parameters = _module_function_parameters(ctx, original.func.value)
    for i, arg in literals:
        if i < len(parameters) and DEVICE_VAR_RE.search(parameters[i]):
            new = rewrite_device(
                ctx, arg.value, "type", updated=updated.args[updated_index(original, updated, arg)].value
            )
            if new is not None:
                updated = replace_arg_value(updated, updated_index(original, updated, arg), new)
    return updated


def _module_function_parameters(ctx: PyContext, name: str) -> list[str]:
    """The positional parameters of the module-level function ``name``, when the module binds that name once, by
    that ``def`` (a name bound twice, or a method, may be another function at the call)."""
    tree = ctx.ast_tree
    if tree is None or len(ctx.bindings.of(name_key(name))) != 1:
        return []
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
            return [a.arg for a in (*statement.args.posonlyargs, *statement.args.args)]
    return []
