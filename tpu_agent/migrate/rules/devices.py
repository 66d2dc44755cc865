"""TPU1xx: device strings, ``torch.device``, ``.cuda()``, ``.is_cuda`` and pinned-memory devices.

Strings are rewritten only in device positions (``torch.device(...)``, ``device=``, ``.to(...)``,
``map_location=``, variables, parameters and ``--device`` defaults whose name says "device"), never by
substring: a log line that mentions CUDA stays as it is. For the accelerator target, API positions get the
module's resolver (``DEVICE``) and variables get its type string (``DEVICE.type``), which every API that
took ``"cuda"`` also takes; for the TPU target both become ``"tpu"``.

Why this module is long: it is one rule family (device strings, objects and moves), and its rules share the
device-expression classifier and the resolver they all write, so they are kept with them in one module. The
tests of a device (``x.is_cuda``, ``x.device.type == "cuda"``, ``device == "cuda"``) live in
:mod:`~tpu_agent.migrate.rules.device_tests`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.cstnodes import walk
from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules._base import TEXT_KINDS, Family, TextFix
from tpu_agent.migrate.rules._bound import bound_earlier
from tpu_agent.migrate.rules._cst import (
    arg_source,
    drop_original_args,
    keep_parens,
    keyword,
    positional,
    prepend_args,
    replace_arg_value,
    replace_original_arg,
    source,
    string_value,
    updated_index,
)
from tpu_agent.migrate.rules._rank import (
    in_place,
    indexed_device,
    indexed_type,
    is_rank_index,
    is_rank_value,
    rank_device,
)
from tpu_agent.migrate.rules.references import ACCELERATOR, DATA, DEVICE, TORCH_TPU

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext, TextContext

FAMILY = Family("devices")

FAMILY.rule(
    code="TPU101",
    name="cuda-device-string",
    safety=Safety.SAFE,
    summary='A CUDA device ("cuda", "cuda:N", torch.device("cuda")) in a device position.',
    rationale="TorchTPU's device is 'tpu'. The accelerator target writes one module-level resolver (the accelerator "
    "in use, or the CPU) so that the same file keeps running on CUDA and CPU-only machines. TorchTPU runs one device "
    "per process, so a literal index is dropped: the process's device is selected by the launcher (and on CUDA by "
    "torch.accelerator.set_device_index); torch.device('cuda', rank) keeps its rank off TPU, as TPU102 says. "
    'A test of a device string against "cuda" (device == "cuda", "cuda" in '
    'device, device.startswith("cuda"), device in ("cuda", "mps")) changes with the value: it asks whether the device '
    'is the accelerator in use (device == DEVICE.type != "cpu", TPU104\'s form; the other members of a collection '
    "after it), so the migrated program takes the accelerator branch on TPU and, as before, the CPU branch on a "
    "machine without an accelerator.",
    before='x = torch.zeros(3, device="cuda:0")\nmodel.to(torch.device("cuda"))',
    after='DEVICE = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")\n'
    "x = torch.zeros(3, device=DEVICE)\nmodel.to(DEVICE)",
    references=(DEVICE, ACCELERATOR),
    since_torch="2.7",
    apis=(
        ApiEquivalent(
            'torch.device("cuda"), "cuda", "cuda:N" in a device position',
            'DEVICE, the module\'s accelerator-or-CPU resolver (--target tpu: "tpu")',
        ),
        ApiEquivalent(
            'device == "cuda", "cuda" in device, device.startswith("cuda")',
            'device == DEVICE.type != "cpu", device.partition(":")[0] == DEVICE.type != "cpu" (--target tpu: == "tpu")',
        ),
        ApiEquivalent(
            'device in ("cuda", "mps"), device not in {"cuda"}',
            'device == DEVICE.type != "cpu" or device == "mps", not (device == DEVICE.type != "cpu")',
        ),
    ),
)
FAMILY.rule(
    code="TPU102",
    name="cuda-device-formatted",
    safety=Safety.SAFE,
    summary='A CUDA device built from an index: f"cuda:{rank}", "cuda:%d" % rank, "cuda:" + str(rank).',
    rationale="TorchTPU maps one device to each process (each rank sees its chip as tpu:0 and the launcher selects "
    "it), so on TPU a per-rank device string becomes the plain device; on CUDA and the other accelerators the rank's "
    "index still selects its device (a program that never calls set_device would otherwise put every rank on device "
    "0). The accelerator target chooses at run time; the tpu target writes the plain device. torch.device('cuda', "
    "rank) is TPU101's and gets the same treatment.",
    before='device = f"cuda:{local_rank}"',
    after='device = DEVICE.type if DEVICE.type in ("cpu", "tpu") else f"{DEVICE.type}:{local_rank}"',
    references=(DEVICE, ACCELERATOR),
    since_torch="2.7",
    apis=(
        ApiEquivalent(
            'f"cuda:{rank}", "cuda:%d" % rank, "cuda:" + str(rank)',
            'DEVICE.type if DEVICE.type in ("cpu", "tpu") else f"{DEVICE.type}:{rank}" (DEVICE for a device '
            'argument; --target tpu: "tpu")',
        ),
    ),
)
FAMILY.rule(
    code="TPU103",
    name="tensor-cuda-method",
    safety=Safety.SAFE,
    summary="Tensor/Module .cuda() moves data to CUDA.",
    rationale="TorchTPU has no .cuda(); .to(device) works for tensors and modules on every backend. A class of this "
    "file that defines its own cuda() method (and is not a tensor or module) is left alone.",
    before="model = Net().cuda()\nx = x.cuda(non_blocking=True)",
    after="model = Net().to(DEVICE)\nx = x.to(DEVICE, non_blocking=True)",
    references=(DEVICE, ACCELERATOR),
    apis=(ApiEquivalent("tensor.cuda(), module.cuda()", ".to(DEVICE)"),),
)
FAMILY.rule(
    code="TPU104",
    name="cuda-device-check",
    safety=Safety.SAFE,
    summary='A check that a tensor is on CUDA: t.is_cuda, t.device.type == "cuda".',
    rationale="On TPU such checks are always False, silently skipping code meant for the accelerator. The fix asks "
    "'on the accelerator in use' (t.device.type == DEVICE.type != \"cpu\"): on a CUDA machine that is exactly "
    "'on CUDA', on a CPU-only machine it stays False as before, and on TPU it holds for TPU tensors. For the tpu "
    'target it is t.device.type == "tpu". Chains of several comparisons are reported.',
    before="if x.is_cuda:\n    ...",
    after='if x.device.type == DEVICE.type != "cpu":\n    ...',
    references=(DEVICE, ACCELERATOR),
    apis=(
        ApiEquivalent("t.is_cuda", 't.device.type == DEVICE.type != "cpu"'),
        ApiEquivalent('t.device.type == "cuda"', 't.device.type == DEVICE.type != "cpu"'),
        ApiEquivalent(
            't.device.type in ("cuda", "mps")', 't.device.type == DEVICE.type != "cpu" or t.device.type == "mps"'
        ),
    ),
)
FAMILY.rule(
    code="TPU105",
    name="pin-memory-device",
    safety=Safety.SAFE,
    summary='A pinned-memory device argument: DataLoader(pin_memory_device="cuda"), t.pin_memory("cuda").',
    rationale="Pinned memory is allocated for the current accelerator without a device argument (deprecated since "
    "torch 2.8); naming 'cuda' fails where there is no CUDA.",
    before='DataLoader(ds, pin_memory=True, pin_memory_device="cuda")',
    after="DataLoader(ds, pin_memory=True)",
    references=(DATA,),
    since_torch="2.5",
    apis=(
        ApiEquivalent('DataLoader(..., pin_memory_device="cuda")', "DataLoader(..., pin_memory=True)"),
        ApiEquivalent('t.pin_memory("cuda")', "t.pin_memory()"),
    ),
)
FAMILY.rule(
    code="TPU106",
    name="config-device-value",
    safety=Safety.SAFE,
    summary="A CUDA device in a launch script or config: device: cuda, --device cuda, DEVICE=cuda.",
    rationale="Config values are read by code this tool cannot see, so they change only for the TPU target (to 'tpu'); "
    "for the accelerator target they are reported.",
    before="device: cuda:0",
    after="device: tpu",
    references=(TORCH_TPU,),
    apis=(
        ApiEquivalent(
            "device: cuda, --device cuda, DEVICE=cuda in configs and launch scripts",
            "device: tpu (--target tpu; reported for the accelerator target)",
        ),
    ),
)

_CUDA_DEVICE_RE = re.compile(r"cuda(?::\d+)?")
DEVICE_VAR_RE = re.compile(r"(?:^|_)(?:dev|device|device_type)$", re.IGNORECASE)
_AVAILABILITY_CHECKS = frozenset({"torch.cuda.is_available", "torch.accelerator.is_available"})
# functions whose first positional argument is a device
_DEVICE_FIRST = frozenset({"torch.set_default_device", "torch.get_device_module", "torch.Generator"})


def cuda_device_code(ctx: PyContext, node: cst.CSTNode) -> str | None:
    """The rule a CUDA device expression falls under (TPU101 literal, TPU102 with an index), else None."""
    value = string_value(node)
    if value is not None:
        return "TPU101" if _CUDA_DEVICE_RE.fullmatch(value) else None
    if isinstance(node, cst.FormattedString):
        parts = node.parts
        texts = [p.value for p in parts if isinstance(p, cst.FormattedStringText)]
        if len(texts) == len(parts):
            return "TPU101" if _CUDA_DEVICE_RE.fullmatch("".join(texts)) else None
        if (
            len(parts) == 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == "cuda:"
            and isinstance(parts[1], cst.FormattedStringExpression)
        ):
            return "TPU102"
        return None
    if isinstance(node, cst.BinaryOperation):
        left = string_value(node.left)
        if isinstance(node.operator, cst.Modulo) and left in ("cuda:%d", "cuda:%s", "cuda:%i"):
            return "TPU102"
        if isinstance(node.operator, cst.Add) and left == "cuda:":
            return "TPU102"
        return None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
        return "TPU102" if string_value(node.func.value) in ("cuda:{}", "cuda:{0}") else None
    if isinstance(node, cst.IfExp):
        return cuda_device_code(ctx, node.body)
    return None


def cuda_device_index(ctx: PyContext, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The index a CUDA device expression names (``3`` for "cuda:3", ``i`` for torch.device("cuda", i) or
    f"cuda:{i}"), else None; None too when the index itself mentions CUDA, since it is rewritten elsewhere.

    Needed where the device becomes DEVICE / torch.device("tpu"), which carry no index, but the rewritten
    call takes an index (torch.accelerator.set_device_index raises on a device without one)."""
    index: cst.BaseExpression | None = None
    value = string_value(node)
    if value is not None:
        number = value.partition(":")[2]
        index = cst.Integer(number) if cuda_device_code(ctx, node) and number.isdigit() else None
    elif isinstance(node, cst.FormattedString) and cuda_device_code(ctx, node) == "TPU102":
        index = node.parts[1].expression  # type: ignore[attr-defined]  # f"cuda:{i}": checked by cuda_device_code
    elif isinstance(node, cst.BinaryOperation) and cuda_device_code(ctx, node) == "TPU102":
        index = node.right
        if isinstance(index, cst.Call) and isinstance(index.func, cst.Name) and index.func.value == "str":
            index = index.args[0].value if len(index.args) == 1 else None
    elif isinstance(node, cst.Call) and ctx.qualname(node) == "torch.device":
        kind, position = positional(node, 0), positional(node, 1) or keyword(node, "index")
        if kind is not None and position is None:
            return cuda_device_index(ctx, kind.value)
        if kind is not None and position is not None and string_value(kind.value) == "cuda":
            index = position.value
    if index is None or _refers_to_cuda(ctx, index):
        return None
    if _environment_text(ctx, index):  # f"cuda:{os.environ['LOCAL_RANK']}": an index must be an int
        return cst.Call(func=cst.Name("int"), args=[cst.Arg(index)])
    return index


def _environment_text(ctx: PyContext, node: cst.BaseExpression) -> bool:
    """``os.environ["LOCAL_RANK"]``, ``os.environ.get("RANK")``, ``os.getenv("RANK")``: text, which a device
    string takes but torch.device(type, index) and set_device_index refuse."""
    if isinstance(node, cst.Subscript):
        return ctx.qualname(node.value) == "os.environ"
    return isinstance(node, cst.Call) and ctx.qualname(node) in ("os.environ.get", "os.getenv")


def known_cuda_index(ctx: PyContext, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """The index the CUDA device ``value`` names (``local_rank`` in ``torch.device("cuda", local_rank)``), also
    through a name bound just before; None when it names none."""
    if isinstance(value, cst.Name):
        value = bound_earlier(ctx, value.value) or value
    return cuda_device_index(ctx, value)


def _refers_to_cuda(ctx: PyContext, node: cst.CSTNode) -> bool:
    """Whether the expression names something under ``torch.cuda`` or holds a CUDA device string (the rules
    rewrite those parts themselves); a name such as ``cfg.cuda_rank`` or a comment saying "cuda" does not count."""
    for current in walk(node):
        if isinstance(current, (cst.Name, cst.Attribute)):
            qualname = ctx.qualname(current) or ""
            if qualname == "torch.cuda" or qualname.startswith("torch.cuda."):
                return True
        elif isinstance(current, (cst.SimpleString, cst.FormattedString)) and cuda_device_code(ctx, current):
            return True
    return False


def is_availability_fallback(ctx: PyContext, node: cst.CSTNode, fallback: str = "cpu") -> bool:
    """``X if torch.cuda.is_available() else "cpu"``: the whole expression means 'the accelerator or the CPU'."""
    return (
        isinstance(node, cst.IfExp)
        and string_value(node.orelse) == fallback
        and isinstance(node.test, cst.Call)
        and not node.test.args
        and ctx.qualname(node.test) in _AVAILABILITY_CHECKS
    )


def rewrite_device(
    ctx: PyContext,
    original: cst.BaseExpression,
    form: str,
    code: str | None = None,
    updated: cst.BaseExpression | None = None,
    index: cst.BaseExpression | None = None,
) -> cst.BaseExpression | None:
    """The replacement for a CUDA device expression in a device position, or None (not one, or not fixed).

    ``form`` is ``"device"`` (a torch.device), ``"value"`` (anything a device argument accepts) or ``"type"``
    (a device type string, also used for variables whose later use is unknown). ``code`` reports the finding
    under another family's rule (``init_device_mesh("cuda")`` is TPU404). In ``"cuda" if flag else "cpu"``
    only the CUDA branch changes (the flag may be the user's choice), unless the flag is the availability
    check itself; ``updated`` is the transformed expression whose other parts are kept. A device built from a
    rank (``f"cuda:{rank}"``, or ``index``: the one ``torch.device("cuda", rank)`` gave) keeps its index off TPU
    (:func:`~tpu_agent.migrate.rules._rank.rank_device`). In ``detected() or "cuda"`` only the fallback changes.
    """
    if isinstance(original, cst.BooleanOperation) and isinstance(original.operator, cst.Or):
        fallback = rewrite_device(ctx, original.right, "type" if form == "device" else form, code)
        either = updated if isinstance(updated, cst.BooleanOperation) else original
        return either.with_changes(right=fallback) if fallback is not None else None
    found = cuda_device_code(ctx, original)
    if found is None:
        return None
    code = code or found
    if isinstance(original, cst.IfExp) and not is_availability_fallback(ctx, original):
        branch = rewrite_device(ctx, original.body, "type" if form == "device" else form, code)
        base = updated if isinstance(updated, cst.IfExp) else original
        return base.with_changes(body=branch) if branch is not None else None
    template = original.body if isinstance(original, cst.IfExp) else original
    build = {"device": ctx.device, "value": ctx.device_value, "type": ctx.device_type}[form]
    index = index or cuda_device_index(ctx, template)
    note = ""
    if is_rank_index(index):
        note = " (the index kept off TPU, which binds one device per process)"
    elif found == "TPU102" or (string_value(template) or "").startswith("cuda:"):
        note = " (index dropped: one device per process)"

    def indexed() -> cst.BaseExpression | None:
        # the string as written with the accelerator's type for "cuda" (its index may be text); torch.device("cuda",
        # i) as torch.device(DEVICE.type, i)
        if index is None or not is_rank_index(index):
            return None
        if found != "TPU102":
            return indexed_device(ctx, index)
        text = indexed_type(ctx, template)
        if text is None or form != "device":
            return text
        return cst.Call(func=ctx.torch_attr("device"), args=[cst.Arg(text)])

    new = ctx.fix(
        code,
        original,
        lambda: rank_device(ctx, build(template), indexed),
        lambda n: f"CUDA device {source(original)} -> {source(n)}{note}",
    )
    return in_place(ctx, original, new) if new is not None else None


@FAMILY.visit(cst.IfExp)
def _claim_availability_test(ctx: PyContext, node: cst.IfExp) -> None:
    # `"cuda" if torch.cuda.is_available() else "cpu"` is one device expression, reported once as TPU101.
    if cuda_device_code(ctx, node.body) and is_availability_fallback(ctx, node):
        ctx.claim(node.test.func)  # type: ignore[attr-defined]


@FAMILY.leave(cst.Call)
def device_arguments(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    qualname = ctx.qualname(original)
    if qualname == "torch.device":
        arg = positional(original, 0) or keyword(original, "type")
        if arg is None or ctx.is_claimed(original):  # claimed: a device_id entry (TPU407) needs its index
            return updated
        index = updated_index(original, updated, arg)
        if isinstance(arg.value, cst.IfExp) and not is_availability_fallback(ctx, arg.value):
            branch = rewrite_device(ctx, arg.value, "type", updated=updated.args[index].value)
            return replace_arg_value(updated, index, branch) if branch is not None else updated
        new = rewrite_device(ctx, arg.value, "device", index=cuda_device_index(ctx, original))
        return keep_parens(original, new) if new is not None else updated
    if qualname in ctx.claimed_calls:
        return updated
    func = original.func
    if isinstance(func, cst.Attribute) and qualname is None:
        method = func.attr.value
        if method == "cuda":
            return _cuda_method(ctx, original, updated)
        if method in ("pin_memory", "is_pinned"):
            arg = positional(original, 0) or keyword(original, "device")
            if (
                arg is not None
                and cuda_device_code(ctx, arg.value)
                and ctx.report("TPU105", original, f".{method}({source(arg.value)}) -> .{method}()")
            ):
                return drop_original_args(original, updated, [arg])
            return updated
        if method == "add_argument":
            return _argparse_default(ctx, original, updated)
    args = list(updated.args)
    changed = False
    for i, arg in enumerate(original.args):
        name = arg.keyword.value if arg.keyword is not None else None
        if (
            name is None
            and i == 0
            and (
                (isinstance(func, cst.Attribute) and func.attr.value == "to" and qualname is None)
                or qualname in _DEVICE_FIRST
            )
        ):
            form = "value"
        elif name in ("device", "map_location"):
            form = "value"
        elif name == "device_type":
            form = "type"
        elif name == "pin_memory_device":
            if cuda_device_code(ctx, arg.value) and ctx.report("TPU105", arg, f"{arg_source(arg)} removed"):
                return drop_original_args(original, updated, [arg])
            continue
        else:
            continue
        j = updated_index(original, updated, arg)
        new = rewrite_device(ctx, arg.value, form, updated=args[j].value)
        if new is not None:
            args[j] = args[j].with_changes(value=new)
            changed = True
    return updated.with_changes(args=args) if changed else updated


def _cuda_method(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    receiver = original.func.value  # type: ignore[attr-defined]
    if ctx.is_user_cuda_receiver(receiver):
        return updated
    # .cuda(device=None, non_blocking=False, memory_format=...): the device index goes (a rank's stays off TPU),
    # the rest stays.
    index = positional(original, 0) or keyword(original, "device")
    shown = source(index.value) if index else ""

    def build() -> cst.BaseExpression:
        rank = index.value if index is not None and is_rank_value(index.value) else None
        return rank_device(ctx, ctx.device_value(), lambda: indexed_device(ctx, rank) if rank is not None else None)

    device = ctx.fix("TPU103", original, build, lambda d: f".cuda({shown}) -> .to({source(d)})")
    if device is None:
        return updated
    call = drop_original_args(original, updated, [index]) if index is not None else updated
    call = call.with_changes(func=call.func.with_changes(attr=cst.Name("to")))
    return prepend_args(call, [cst.Arg(device)])


def _argparse_default(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.Call:
    flags = [string_value(arg.value) or "" for arg in original.args if arg.keyword is None]
    if not any("device" in flag for flag in flags):
        return updated
    default = keyword(original, "default")
    if default is not None:
        new = rewrite_device(
            ctx, default.value, "type", updated=updated.args[updated_index(original, updated, default)].value
        )
        if new is not None:
            return replace_original_arg(original, updated, default, new)
    return updated


def is_device_variable(target: cst.BaseExpression) -> bool:
    """A name or attribute whose name says it holds a device (``device``, ``args.device``, ``dev``,
    ``device_type``): CUDA literals assigned to one are rewritten by name, and tests of it follow."""
    if isinstance(target, cst.Name):
        return bool(DEVICE_VAR_RE.search(target.value))
    if isinstance(target, cst.Attribute):
        return bool(DEVICE_VAR_RE.search(target.attr.value))
    return False


@FAMILY.leave(cst.Assign)
def device_variable(ctx: PyContext, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
    if all(is_device_variable(t.target) for t in original.targets):
        new = rewrite_device(ctx, original.value, "type", updated=updated.value)
        if new is not None:
            return updated.with_changes(value=new)
    return updated


@FAMILY.leave(cst.AnnAssign)
def annotated_device_variable(ctx: PyContext, original: cst.AnnAssign, updated: cst.AnnAssign) -> cst.AnnAssign:
    if original.value is not None and is_device_variable(original.target):
        new = rewrite_device(ctx, original.value, "type", updated=updated.value)
        if new is not None:
            return updated.with_changes(value=new)
    return updated


@FAMILY.leave(cst.Param)
def device_parameter_default(ctx: PyContext, original: cst.Param, updated: cst.Param) -> cst.Param:
    if original.default is not None and DEVICE_VAR_RE.search(original.name.value):
        new = rewrite_device(ctx, original.default, "type", updated=updated.default)
        if new is not None:
            return updated.with_changes(default=new)
    return updated


@FAMILY.leave(cst.Return)
def device_function_result(ctx: PyContext, original: cst.Return, updated: cst.Return) -> cst.Return:
    """``return "cuda"`` from a function or property whose name says device (a test case's ``device_type``, a
    ``get_device()`` helper): the value is a device as surely as a variable of that name holds one."""
    function = next((s for s in reversed(ctx.stmt_stack) if isinstance(s, cst.FunctionDef)), None)
    if original.value is not None and function is not None and DEVICE_VAR_RE.search(function.name.value):
        new = rewrite_device(ctx, original.value, "type", updated=updated.value)
        if new is not None:
            return updated.with_changes(value=new)
    return updated


# ---- launch scripts and configs -----------------------------------------------------------------------
def _config_device_replace(ctx: TextContext, match: re.Match[str]) -> str | None:
    if ctx.target.value != "tpu":
        return None
    return "tpu"


def _config_device_message(ctx: TextContext, match: re.Match[str]) -> str:
    if ctx.target.value != "tpu":
        return (
            f"device value '{match.group(0)}': set it to the device your launcher resolves "
            "(or rerun with --target tpu to write 'tpu')"
        )
    return f"device value '{match.group(0)}' -> 'tpu'"


FAMILY.text(
    TextFix(
        code="TPU106",
        kinds=TEXT_KINDS,
        # YAML `device: cuda`, env `DEVICE=cuda`, shell `--device cuda` / `--device=cuda:0`; the value only
        pattern=re.compile(
            r"(?:(?<=\bdevice: )|(?<=\bdevice:)|(?<=\bDEVICE=)|(?<=\bdevice=)|(?<=--device )|(?<=--device=)"
            r"|(?<=\bdevice: [\"'])|(?<=\bDEVICE=[\"'])|(?<=--device=[\"']))cuda(?::\d+)?\b"
        ),
        replace=_config_device_replace,
        message=_config_device_message,
    )
)
