"""TPU216/TPU217: the per-process device count read as the number of devices a multi-process run may use.

CUDA code launched by torchrun checks that the host has a GPU for each rank before binding one
(``if torch.cuda.device_count() < world_size: raise ...`` then ``set_device(local_rank)``): every rank sees every
GPU. TorchTPU binds each process to its own chip, seen as tpu:0, so ``torch.accelerator.device_count()`` is 1 in
every rank and the check fails for any world size above 1 ("need 2 GPUs, found 1"). Such a guard (``if ...:
raise``, ``assert``) is kept off TPU for the accelerator target exactly as TPU201 keeps ``set_device`` off TPU
(:func:`~tpu_agent.migrate.rules.bind_device.keep_off_tpu`; an ``if`` guard takes the test in its own ``if``) and
deleted for the tpu target (an ``if`` it empties goes with it). Any other comparison or arithmetic of the count
with a process count (``min(device_count(), world_size)``, ``world_size // device_count()``) is reported (TPU217).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety, Target
from tpu_agent.migrate.rules._cst import source
from tpu_agent.migrate.rules.accelerator_guards import off_tpu
from tpu_agent.migrate.rules.bind_device import ONE_DEVICE, keep_off_tpu, kept_off_tpu, tests_off_tpu
from tpu_agent.migrate.rules.cuda_api import FAMILY
from tpu_agent.migrate.rules.references import ACCELERATOR, TORCH_TPU_GUIDE, TORCHRUN

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

_COUNTS = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count"})
# How repos name the number of processes: torchrun's WORLD_SIZE / LOCAL_WORLD_SIZE (read from os.environ or held
# in a variable), argparse's args.world_size / args.nproc_per_node / args.ngpus_per_node, mp.spawn's nprocs.
_PROCESS_COUNT = re.compile(
    r"(?<![A-Za-z0-9])(?:local_?)?world_?size(?![A-Za-z0-9])|(?<![A-Za-z0-9])nprocs?(?:_per_node)?(?![A-Za-z0-9])"
    r"|(?<![A-Za-z0-9])(?:n_?|num_)?gpus(?:_per_node)?(?![A-Za-z0-9])|(?<![A-Za-z0-9])num_processes(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_CONTRACT = "TorchTPU binds one chip per process (tpu:0), so device_count() is 1 in every rank of a multi-process run"

FAMILY.rule(
    code="TPU216",
    name="device-count-world-size-guard",
    safety=Safety.SAFE,
    summary="A guard that the per-process device count covers the world size: `if torch.cuda.device_count() < "
    "world_size: raise ...`, `assert torch.cuda.device_count() >= args.nproc_per_node`.",
    rationale="On CUDA every rank sees every GPU of the host, so the guard checks there is one per rank. TorchTPU "
    "binds each process to its own chip (seen as tpu:0; Ray, verl and TorchTitan rely on it), so device_count() "
    "is 1 in every rank and the guard raises for any world size above 1, and passes trivially for 1: on TPU it "
    "can only fail, never catch a real shortage (the launcher binds a chip per process or refuses the count). "
    "So it is safe to skip there: for the accelerator target the guard still runs on CUDA as before and is "
    "skipped on TPU (DEVICE.type != 'tpu', as TPU201 does for set_device); for the tpu target it is deleted, "
    "and an if it leaves empty goes with it.",
    before="if torch.cuda.device_count() < world_size:\n"
    '    raise RuntimeError(f"need {world_size} GPUs")\n'
    "torch.cuda.set_device(local_rank)",
    after='if torch.accelerator.device_count() < world_size and DEVICE.type != "tpu":  # TorchTPU binds one device '
    "per process\n"
    '    raise RuntimeError(f"need {world_size} GPUs")\n'
    'if DEVICE.type != "tpu":  # TorchTPU binds one device per process\n'
    "    torch.accelerator.set_device_index(local_rank)\n"
    "# --target tpu: both are deleted",
    references=(TORCH_TPU_GUIDE, ACCELERATOR, TORCHRUN),
    apis=(
        ApiEquivalent(
            "if torch.cuda.device_count() < world_size: raise ...",
            'the same guard behind DEVICE.type != "tpu" (--target tpu: deleted)',
            "torch.accelerator.device_count() is 1 in every rank of a multi-process TorchTPU run",
        ),
    ),
)
FAMILY.rule(
    code="TPU217",
    name="device-count-per-process",
    safety=Safety.MANUAL,
    summary="The device count combined with a process count other than in a guard: `min(torch.cuda.device_count(), "
    "world_size)`, `world_size // torch.cuda.device_count()`, `if device_count() == world_size: ...`.",
    rationale="Under TorchTPU device_count() is 1 in every rank of a multi-process run, so arithmetic or branches "
    "that read it as the host's device count (how many ranks fit, which device a rank takes) give other results "
    "than on CUDA. Which value the code means (1 per process, the launcher's process count, the chips of the host) "
    "is a person's call; the report names the line.",
    before="gpus = min(torch.cuda.device_count(), world_size)",
    after="# one device per process under TorchTPU; the host's processes are the world size\n"
    "gpus = 1 if DEVICE.type == 'tpu' else min(torch.accelerator.device_count(), world_size)",
    references=(TORCH_TPU_GUIDE, ACCELERATOR),
    apis=(
        ApiEquivalent(
            "min(torch.cuda.device_count(), world_size)",
            "1 device per process under TorchTPU: the launcher's process count is the world size",
        ),
    ),
)


def _counts_devices(ctx: PyContext, node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and ctx.qualname(node) in _COUNTS


def _pairs_count(ctx: PyContext, operands: list[cst.BaseExpression]) -> bool:
    """Whether one of ``operands`` is a device_count() call and another names a process count."""
    return any(_counts_devices(ctx, op) for op in operands) and any(
        not _counts_devices(ctx, op) and _PROCESS_COUNT.search(source(op)) for op in operands
    )


def _and_operands(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return [*_and_operands(test.left), *_and_operands(test.right)]
    return [test]


# how a guard stops the run besides ``raise``: ``sys.exit(1)``, the site builtins
_EXITS = frozenset({"sys.exit", "os._exit"})


def _stops(ctx: PyContext, statement: cst.CSTNode) -> bool:
    if isinstance(statement, cst.Raise):
        return True
    call = statement.value if isinstance(statement, cst.Expr) else None
    if not isinstance(call, cst.Call):
        return False
    func = call.func
    return ctx.qualname(call) in _EXITS or (
        isinstance(func, cst.Name) and func.value in ("exit", "quit") and func.value not in ctx.aliases
    )


def _guard_comparison(ctx: PyContext, statement: cst.CSTNode) -> cst.Comparison | None:
    """The comparison of a device count with a process count that ``statement`` is a guard on: an ``if`` (no
    ``else``) whose body ends in ``raise`` or ``sys.exit(...)``, or an ``assert``; the ``if`` may already hold the off-TPU test."""
    if isinstance(statement, cst.If) and statement.orelse is None:
        last = statement.body.body[-1]
        small = last.body if isinstance(last, cst.SimpleStatementLine) else [last]
        if not (small and _stops(ctx, small[-1])):
            return None
        test = statement.test
    elif isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        assertion = statement.body[0]
        if not isinstance(assertion, cst.Assert):
            return None
        test = assertion.test
    else:
        return None
    found = [
        op
        for op in _and_operands(test)
        if isinstance(op, cst.Comparison) and _pairs_count(ctx, [op.left, *(t.comparator for t in op.comparisons)])
    ]
    return found[0] if len(found) == 1 else None


@FAMILY.visit(cst.If)
def _count_guard(ctx: PyContext, node: cst.If) -> None:
    if _guard_comparison(ctx, node) is None or tests_off_tpu(node.test) or kept_off_tpu(ctx):
        return
    if ctx.target is Target.TPU:
        if ctx.report("TPU216", node.test, f"deleted the guard `if {source(node.test)}`: {_CONTRACT}"):
            ctx.claim(node)  # its body is emptied below, and the emptied if goes
    elif ctx.report("TPU216", node.test, f"`if {source(node.test)}` runs off TPU only: {_CONTRACT}"):
        ctx.extra_tests[id(node)] = (off_tpu(ctx), ONE_DEVICE)


@FAMILY.leave(cst.SimpleStatementLine)
def count_guard_statement(
    ctx: PyContext, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
) -> cst.BaseStatement:
    parent = ctx.stmt_stack[-2] if len(ctx.stmt_stack) > 1 else None
    if parent is not None and ctx.is_claimed(parent):
        return updated.with_changes(body=[])  # a line of a deleted guard's body
    if _guard_comparison(ctx, original) is None or kept_off_tpu(ctx):
        return updated
    text = source(original.body[0])
    if ctx.target is Target.TPU:
        if ctx.report("TPU216", original, f"deleted `{text}`: {_CONTRACT}"):
            return updated.with_changes(body=[])
    elif ctx.report("TPU216", original, f"`{text}` runs off TPU only: {_CONTRACT}"):
        return keep_off_tpu(ctx, original, updated)
    return updated


@FAMILY.leave(cst.SimpleStatementSuite)
def empty_guard_suite(
    ctx: PyContext, original: cst.SimpleStatementSuite, updated: cst.SimpleStatementSuite
) -> cst.SimpleStatementSuite:
    """``if device_count() < n: raise ...`` on one line, deleted for the tpu target: the emptied suite takes the
    ``if`` with it."""
    if ctx.stmt_stack and ctx.is_claimed(ctx.stmt_stack[-1]):
        return updated.with_changes(body=[])
    return updated


def _report_use(ctx: PyContext, node: cst.CSTNode) -> None:
    ctx.report(
        "TPU217",
        node,
        f"`{source(node)}` reads the device count as the host's: {_CONTRACT}; decide what it means there",
        fixable=False,
    )


@FAMILY.visit(cst.Comparison)
def _count_comparison(ctx: PyContext, node: cst.Comparison) -> None:
    if not _pairs_count(ctx, [node.left, *(t.comparator for t in node.comparisons)]):
        return
    if ctx.stmt_stack and _guard_comparison(ctx, ctx.stmt_stack[-1]) is node:
        return  # TPU216's
    _report_use(ctx, node)


@FAMILY.visit(cst.BinaryOperation)
def _count_arithmetic(ctx: PyContext, node: cst.BinaryOperation) -> None:
    if _pairs_count(ctx, [node.left, node.right]):
        _report_use(ctx, node)


@FAMILY.visit(cst.Call)
def _count_bound(ctx: PyContext, node: cst.Call) -> None:
    if (
        isinstance(node.func, cst.Name)
        and node.func.value in ("min", "max")
        and _pairs_count(ctx, [arg.value for arg in node.args])
    ):
        _report_use(ctx, node)
