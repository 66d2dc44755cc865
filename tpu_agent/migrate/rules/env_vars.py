"""TPU7xx: CUDA and NCCL environment variables, in Python (``os.environ``) and in launch scripts and configs.

Variables with a TorchTPU twin are renamed (``CUDA_VISIBLE_DEVICES`` -> ``TPU_VISIBLE_DEVICES``,
``CUDA_LAUNCH_BLOCKING`` -> ``TORCH_TPU_LAUNCH_BLOCKING``, ``PYTORCH_CUDA_ALLOC_CONF`` -> ``PYTORCH_ALLOC_CONF``).
NCCL settings have no TPU meaning: diagnostic ones are removed, network ones only with ``--unsafe-fixes``
(they may still matter on the CUDA cluster), and reads of them are reported. cuBLAS/TF32 numerics settings
(``CUBLAS_WORKSPACE_CONFIG``, ``NVIDIA_TF32_OVERRIDE``) set from Python, dicts or launch scripts are removed
with ``--unsafe-fixes`` too: they do nothing on TPU, but the CUDA run they were written for loses them. For the
accelerator target, a Python statement that sets one of them (or cuDNN determinism, in
:mod:`~tpu_agent.migrate.rules.backend_flags`) on a line of its own is kept for CUDA runs behind a not-TPU guard
instead (TPU709): the same code keeps its CUDA behaviour, and TorchTPU never runs it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.cstnodes import string_like
from tpu_agent.migrate.model import ApiEquivalent, FileKind, Safety, Target
from tpu_agent.migrate.rules._base import TEXT_KINDS, Family, TextFix
from tpu_agent.migrate.rules._cst import positional, source, string_value
from tpu_agent.migrate.rules.accelerator_guards import guarded_statement, off_tpu
from tpu_agent.migrate.rules.bind_device import kept_off_tpu
from tpu_agent.migrate.rules.references import (
    CLOUD_TPU_PYTORCH,
    DETERMINISM,
    DISTRIBUTED,
    ENV_VARS,
    MATMUL_PRECISION,
    TORCH_TPU,
    TORCHRUN,
)

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext, TextContext

FAMILY = Family("env-vars")

FAMILY.rule(
    code="TPU701",
    name="cuda-visible-devices",
    safety=Safety.SAFE,
    summary="CUDA_VISIBLE_DEVICES.",
    rationale="TorchTPU reads TPU_VISIBLE_DEVICES as the source of truth for the devices a process sees (and rewrites "
    "libtpu's TPU_VISIBLE_CHIPS to match).",
    before="CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node=2 train.py",
    after="TPU_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node=2 train.py",
    references=(TORCH_TPU,),
    apis=(ApiEquivalent("CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_DEVICES"),),
)
FAMILY.rule(
    code="TPU702",
    name="cuda-launch-blocking",
    safety=Safety.SAFE,
    summary="CUDA_LAUNCH_BLOCKING.",
    rationale="TORCH_TPU_LAUNCH_BLOCKING=1 selects TorchTPU's launch-blocking eager mode, the TPU equivalent for "
    "finding the operation that fails.",
    before="CUDA_LAUNCH_BLOCKING=1 python train.py",
    after="TORCH_TPU_LAUNCH_BLOCKING=1 python train.py",
    references=(TORCH_TPU,),
    apis=(ApiEquivalent("CUDA_LAUNCH_BLOCKING", "TORCH_TPU_LAUNCH_BLOCKING"),),
)
FAMILY.rule(
    code="TPU703",
    name="nccl-debug-env",
    safety=Safety.SAFE,
    summary="NCCL diagnostic and error-handling variables: NCCL_DEBUG, NCCL_DEBUG_SUBSYS, "
    "TORCH_NCCL_ASYNC_ERROR_HANDLING...",
    rationale="They configure the NCCL library only and have no effect on TPU (tpu_dist); removing them changes no "
    "results.",
    before="export NCCL_DEBUG=INFO",
    after="",
    references=(DISTRIBUTED,),
    apis=(ApiEquivalent("NCCL_DEBUG, NCCL_DEBUG_SUBSYS, TORCH_NCCL_ASYNC_ERROR_HANDLING", "delete it"),),
)
FAMILY.rule(
    code="TPU704",
    name="nccl-network-env",
    safety=Safety.UNSAFE,
    summary="Other NCCL variables: NCCL_SOCKET_IFNAME, NCCL_IB_*, NCCL_P2P_DISABLE...",
    rationale="They tune NCCL transport and are ignored on TPU, but may still be needed where the same script runs on "
    "the CUDA cluster; TPU interconnect settings are TORCH_TPU_TOPOLOGY and the slice-builder addresses instead. "
    "Code migrated for the tpu target no longer runs on CUDA, so there the removal is safe.",
    tpu_safety=Safety.SAFE,
    before="export NCCL_SOCKET_IFNAME=eth0",
    after="",
    references=(DISTRIBUTED,),
    apis=(
        ApiEquivalent(
            "NCCL_SOCKET_IFNAME, NCCL_IB_*, NCCL_P2P_DISABLE",
            "delete it for TPU runs (TPU interconnect: TORCH_TPU_TOPOLOGY)",
        ),
    ),
)
FAMILY.rule(
    code="TPU705",
    name="cuda-alloc-conf",
    safety=Safety.SAFE,
    summary="PYTORCH_CUDA_ALLOC_CONF.",
    rationale="PYTORCH_ALLOC_CONF is the device-agnostic name (the CUDA name is a deprecated alias since torch 2.9); "
    "the options themselves are backend-specific.",
    before="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    after="PYTORCH_ALLOC_CONF=expandable_segments:True",
    references=(ENV_VARS,),
    since_torch="2.9",
    apis=(ApiEquivalent("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"),),
)
FAMILY.rule(
    code="TPU706",
    name="cuda-toolkit-env",
    safety=Safety.MANUAL,
    summary="CUDA toolkit variables: CUDA_HOME, CUDA_DEVICE_ORDER, TORCH_CUDA_ARCH_LIST...",
    rationale="They configure the CUDA toolchain (compilers, device enumeration, kernel builds); remove them for TPU "
    "runs. Where a script reads them (a build step, a path) the code around the read needs a person.",
    before="export CUDA_HOME=/usr/local/cuda",
    after="# TODO(tpu-agent TPU706): remove for TPU runs",
    references=(CLOUD_TPU_PYTORCH,),
    apis=(ApiEquivalent("CUDA_HOME, CUDA_DEVICE_ORDER, TORCH_CUDA_ARCH_LIST", "remove it for TPU runs"),),
)
FAMILY.rule(
    code="TPU708",
    name="cuda-numerics-env",
    safety=Safety.UNSAFE,
    summary="cuBLAS and TF32 numerics variables set by the program: CUBLAS_WORKSPACE_CONFIG, NVIDIA_TF32_OVERRIDE.",
    rationale="CUBLAS_WORKSPACE_CONFIG makes cuBLAS deterministic and NVIDIA_TF32_OVERRIDE=0 turns TF32 off on "
    "NVIDIA GPUs; neither is read on TPU, so setting them there does nothing and removing them changes no TPU result. "
    "The removal is unsafe because the same script run on the CUDA cluster loses its determinism or precision "
    "setting (safe for the tpu target, whose code no longer runs on CUDA). On every device, torch.use_deterministic_algorithms(True) asks for deterministic kernels and "
    'torch.set_float32_matmul_precision("highest") for full float32 matmuls.',
    before='os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"\ntorch.use_deterministic_algorithms(True)',
    after="torch.use_deterministic_algorithms(True)",
    references=(DETERMINISM, MATMUL_PRECISION),
    tpu_safety=Safety.SAFE,
    apis=(
        ApiEquivalent("CUBLAS_WORKSPACE_CONFIG", "delete it (determinism: torch.use_deterministic_algorithms(True))"),
        ApiEquivalent(
            "NVIDIA_TF32_OVERRIDE", "delete it (float32 matmul precision: torch.set_float32_matmul_precision)"
        ),
    ),
)
FAMILY.rule(
    code="TPU707",
    name="launcher-nproc-gpu",
    safety=Safety.SAFE,
    summary="torchrun --nproc-per-node=gpu.",
    rationale="'gpu' counts CUDA devices and fails without CUDA; 'auto' counts the devices of the current accelerator "
    "(TPU chips, GPUs) and falls back to CPUs.",
    before="torchrun --nproc-per-node=gpu train.py",
    after="torchrun --nproc-per-node=auto train.py",
    references=(TORCHRUN,),
    apis=(ApiEquivalent("torchrun --nproc-per-node=gpu", "torchrun --nproc-per-node=auto"),),
)

FAMILY.rule(
    code="TPU709",
    name="cuda-only-setting",
    safety=Safety.SAFE,
    summary="Accelerator target: a statement line that only sets what NVIDIA libraries read (NCCL network and cuBLAS "
    "numerics variables, torch.backends.cudnn.deterministic = <value read without side effects>).",
    rationale="Removing such a setting (TPU704, TPU708, TPU602) is unsafe where the migrated code still runs on CUDA: "
    "the CUDA run loses its transport, determinism or precision setting. Kept behind `if torch.accelerator."
    'is_available() and DEVICE.type != "tpu":` it runs exactly as before on CUDA and never on TorchTPU, which '
    "reads none of them (its collectives are tpu_dist's, its matmul precision is torch.set_float32_matmul_precision, "
    "and its porting table maps cuDNN determinism to nothing). The tpu target removes them instead.",
    before='os.environ["NCCL_IB_DISABLE"] = "1"\ntorch.backends.cudnn.deterministic = args.deterministic',
    after='if torch.accelerator.is_available() and DEVICE.type != "tpu":  # read by NVIDIA libraries only\n'
    '    os.environ["NCCL_IB_DISABLE"] = "1"\n'
    'if torch.accelerator.is_available() and DEVICE.type != "tpu":  # read by NVIDIA libraries only\n'
    "    torch.backends.cudnn.deterministic = args.deterministic",
    references=(DISTRIBUTED, DETERMINISM),
    apis=(
        ApiEquivalent(
            'os.environ["NCCL_IB_DISABLE"] = "1", os.environ["CUBLAS_WORKSPACE_CONFIG"] = ..., '
            "torch.backends.cudnn.deterministic = flag (accelerator target)",
            'the same line under `if torch.accelerator.is_available() and DEVICE.type != "tpu":`',
        ),
    ),
)

RENAMES = {
    "CUDA_VISIBLE_DEVICES": ("TPU701", "TPU_VISIBLE_DEVICES"),
    "CUDA_LAUNCH_BLOCKING": ("TPU702", "TORCH_TPU_LAUNCH_BLOCKING"),
    "PYTORCH_CUDA_ALLOC_CONF": ("TPU705", "PYTORCH_ALLOC_CONF"),
}
NCCL_DIAGNOSTIC = frozenset(
    {
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
        "NCCL_ASYNC_ERROR_HANDLING",
        "NCCL_BLOCKING_WAIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_BLOCKING_WAIT",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_ENABLE_MONITORING",
        "TORCH_NCCL_DESYNC_DEBUG",
    }
)
CUDA_TOOLKIT = frozenset(
    {
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_DEVICE_ORDER",
        "CUDA_MODULE_LOADING",
        "CUDA_CACHE_PATH",
        "CUDNN_LOGINFO_DBG",
        "TORCH_CUDA_ARCH_LIST",
        "TORCH_CUDNN_V8_API_ENABLED",
        "NVIDIA_VISIBLE_DEVICES",
    }
)
CUDA_NUMERICS = frozenset({"CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE"})
_NCCL_NAME_RE = re.compile(r"(?:TORCH_)?NCCL_[A-Z0-9_]+")
_ENV_LITERAL_RE = re.compile(r"[rRuU]?(['\"])([A-Z][A-Z0-9]*_[A-Z0-9_]*)\1")
_ENVIRON = "os.environ"
_SETTERS = frozenset({"os.environ.setdefault", "os.putenv"})


def nccl_code(name: str) -> str | None:
    if not _NCCL_NAME_RE.fullmatch(name):
        return None
    return "TPU703" if name in NCCL_DIAGNOSTIC else "TPU704"


def dropped_setting_code(name: str) -> str | None:
    """The rule that removes a setting of variable ``name`` (NCCL or CUDA numerics), or None."""
    return "TPU708" if name in CUDA_NUMERICS else nccl_code(name)


def _why_dropped(name: str) -> str:
    if name in CUDA_NUMERICS:
        return f"{name} only configures cuBLAS/TF32 numerics on NVIDIA GPUs"
    return f"{name} only configures NCCL"


def _mentions_dropped_setting(source: str) -> bool:
    """Cheap file-level test before looking at every dict and assignment."""
    return "NCCL" in source or any(name in source for name in CUDA_NUMERICS)


def _nccl_assignment(ctx: PyContext, node: cst.CSTNode) -> cst.SimpleString | None:
    """The variable name string of ``os.environ["NCCL_X"] = ...`` / ``os.environ.setdefault("NCCL_X", ...)`` for
    a variable :func:`dropped_setting_code` removes."""
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        target = node.targets[0].target
        if isinstance(target, cst.Subscript) and ctx.qualname(target.value) == _ENVIRON and len(target.slice) == 1:
            index = target.slice[0].slice
            if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
                name = string_value(index.value)
                return index.value if name is not None and dropped_setting_code(name) else None
    if isinstance(node, cst.Expr) and isinstance(node.value, cst.Call) and ctx.qualname(node.value) in _SETTERS:
        first = positional(node.value, 0)
        if first is not None and isinstance(first.value, cst.SimpleString):
            name = string_value(first.value)
            return first.value if name is not None and dropped_setting_code(name) else None
    return None


@FAMILY.visit(cst.Assign)
@FAMILY.visit(cst.Expr)
def _claim_nccl_setting(ctx: PyContext, node: cst.CSTNode) -> None:
    name = _nccl_assignment(ctx, node)
    if name is not None:
        ctx.claim(name)


def _remove_nccl_setting(
    ctx: PyContext, original: cst.CSTNode, updated: cst.CSTNode
) -> cst.CSTNode | cst.RemovalSentinel:
    name_node = _nccl_assignment(ctx, original)
    if name_node is None:
        return updated
    name = string_value(name_node) or ""
    code = dropped_setting_code(name) or "TPU704"
    if ctx.rules[code].safety_for(ctx.target) is Safety.UNSAFE and keep_for_cuda(ctx, original, _why_dropped(name)):
        return updated
    if ctx.report(code, original, f"removed `{source(original)}`: {_why_dropped(name)}, no effect on TPU"):
        return cst.RemovalSentinel.REMOVE
    return updated


NVIDIA_ONLY = "# read by NVIDIA libraries only"


def keep_for_cuda(ctx: PyContext, original: cst.CSTNode, why: str) -> bool:
    """For the accelerator target, keep the setting ``original`` (a small statement alone on its line) for CUDA runs
    behind a not-TPU guard (TPU709) rather than leave it to an unsafe removal. True when the guard is to be written,
    or an enclosing guard already keeps the line off TPU (a second run: nothing to report)."""
    if ctx.target is not Target.ACCELERATOR or not ctx.stmt_stack:
        return False
    line = ctx.stmt_stack[-1]
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or line.body[0] is not original:
        return False
    if kept_off_tpu(ctx):
        return True
    if not ctx.report("TPU709", original, f"`{source(original)}` kept for CUDA runs only: {why}"):
        return False
    ctx.cuda_only_lines.add(id(line))
    return True


@FAMILY.leave(cst.SimpleStatementLine)
def guard_cuda_only_line(
    ctx: PyContext, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
) -> cst.BaseStatement:
    if id(original) not in ctx.cuda_only_lines:
        return updated
    return guarded_statement(off_tpu(ctx), updated, NVIDIA_ONLY)


FAMILY.leave(cst.Assign)(_remove_nccl_setting)
FAMILY.leave(cst.Expr)(_remove_nccl_setting)


@FAMILY.leave(cst.SimpleString)
def env_name_string(ctx: PyContext, original: cst.SimpleString, updated: cst.SimpleString) -> cst.SimpleString:
    literal = _ENV_LITERAL_RE.fullmatch(original.value)  # cheap: most strings are not variable names
    if literal is None or ctx.is_claimed(original):
        return updated
    name = literal.group(2)
    rename = RENAMES.get(name)
    if rename is not None:
        code, new_name = rename
        new = ctx.fix(code, original, lambda: string_like(original, new_name), lambda n: f"{name} -> {new_name}")
        return new if new is not None else updated
    nccl = nccl_code(name)
    if nccl is not None:
        code = nccl
        ctx.report(code, original, f"{name} only configures NCCL: no effect on TPU; drop its use", fixable=False)
    elif name in CUDA_TOOLKIT:
        ctx.report("TPU706", original, f"{name} configures the CUDA toolchain: remove it for TPU runs")
    elif name in CUDA_NUMERICS:
        ctx.report("TPU708", original, f"{_why_dropped(name)}: no effect on TPU; drop its use", fixable=False)
    return updated


# ---- launch scripts and configs -----------------------------------------------------------------------
_ASSIGN_PREFIX = r"(?:(?<=^)|(?<=[\s;]))(?:export[ \t]+|ENV[ \t]+)?"
_VALUE = r"(?:\"[^\"]*\"|'[^']*'|[^\s;]*)"


def _rename(ctx: TextContext, match: re.Match[str]) -> str | None:
    return RENAMES[match.group(0)][1]


for _name, (_code, _new) in RENAMES.items():
    FAMILY.text(
        TextFix(
            code=_code,
            kinds=TEXT_KINDS,
            pattern=re.compile(rf"\b{_name}\b"),
            replace=_rename,
            message=lambda ctx, m: f"{m.group(0)} -> {RENAMES[m.group(0)][1]}",
        )
    )


def _drop(ctx: TextContext, match: re.Match[str]) -> str | None:
    return ""


def _removed(what: str) -> Callable[[TextContext, re.Match[str]], str]:
    """The finding message of a dropped launch-script setting."""
    return lambda ctx, m: f"removed `{m.group(0).strip()}`: {what}, no effect on TPU"


for _code, _names, _what in (
    ("TPU703", "|".join(sorted(NCCL_DIAGNOSTIC)), "NCCL-only setting"),
    ("TPU704", r"(?:TORCH_)?NCCL_[A-Z0-9_]+", "NCCL-only setting"),
    ("TPU708", "|".join(sorted(CUDA_NUMERICS)), "cuBLAS/TF32 setting for NVIDIA GPUs"),
):
    FAMILY.text(
        TextFix(
            code=_code,
            kinds=frozenset({FileKind.SHELL, FileKind.ENV, FileKind.DOCKERFILE}),
            pattern=re.compile(rf"{_ASSIGN_PREFIX}\b(?:{_names})={_VALUE}[ \t]*"),
            replace=_drop,
            message=_removed(_what),
            drop_line=True,
        )
    )
FAMILY.text(
    TextFix(
        code="TPU704",
        kinds=frozenset({FileKind.YAML}),
        pattern=re.compile(r"\b(?:TORCH_)?NCCL_[A-Z0-9_]+\b"),
        replace=lambda ctx, m: None,
        message=lambda ctx, m: f"{m.group(0)} only configures NCCL: remove it from the TPU job config",
    )
)
FAMILY.text(
    TextFix(
        code="TPU708",
        kinds=frozenset({FileKind.YAML}),
        pattern=re.compile(rf"\b(?:{'|'.join(sorted(CUDA_NUMERICS))})\b"),
        replace=lambda ctx, m: None,
        message=lambda ctx, m: (
            f"{m.group(0)} only configures cuBLAS/TF32 numerics on NVIDIA GPUs: remove it from the TPU job config"
        ),
    )
)
FAMILY.text(
    TextFix(
        code="TPU706",
        kinds=TEXT_KINDS,
        pattern=re.compile(rf"\b(?:{'|'.join(sorted(CUDA_TOOLKIT))})\b"),
        replace=lambda ctx, m: None,
        message=lambda ctx, m: f"{m.group(0)} configures the CUDA toolchain: remove it for TPU runs",
    )
)
FAMILY.text(
    TextFix(
        code="TPU707",
        kinds=TEXT_KINDS,
        pattern=re.compile(r"(?:(?<=--nproc-per-node[= ])|(?<=--nproc_per_node[= ]))gpu\b"),
        replace=lambda ctx, m: "auto",
        message=lambda ctx, m: "--nproc-per-node gpu -> auto (counts the current accelerator's devices)",
    )
)


# ---- NCCL and numerics settings in dicts: os.environ.update({...}), subprocess env={...}, os.environ |= {...}
def _nccl_entries(node: cst.Dict) -> list[tuple[int, cst.SimpleString, str]]:
    """(index, key node, rule) of the dict's NCCL and CUDA numerics variable entries."""
    found = []
    for i, element in enumerate(node.elements):
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
            code = dropped_setting_code(string_value(element.key) or "")
            if code is not None:
                found.append((i, element.key, code))
    return found


@FAMILY.visit(cst.Dict)
def _claim_nccl_entries(ctx: PyContext, node: cst.Dict) -> None:
    if _mentions_dropped_setting(ctx.source):
        for _, key, _ in _nccl_entries(node):
            ctx.claim(key)


@FAMILY.leave(cst.Dict)
def nccl_dict_entries(ctx: PyContext, original: cst.Dict, updated: cst.Dict) -> cst.Dict:
    if not _mentions_dropped_setting(ctx.source):
        return updated
    dropped = set()
    for i, key, code in _nccl_entries(original):
        name = string_value(key) or ""
        if ctx.report(code, key, f"removed {name} from the dict: {_why_dropped(name)}, no effect on TPU"):
            dropped.add(i)
    if not dropped:
        return updated
    kept = [el for i, el in enumerate(updated.elements) if i not in dropped]
    if kept:
        kept[-1] = kept[-1].with_changes(comma=updated.elements[-1].comma)
    return updated.with_changes(elements=kept)
