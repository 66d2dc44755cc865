"""TPU5xx: ``torch.compile`` arguments TorchTPU rejects, CUDA graphs and Inductor configuration.

TorchTPU's ``tpu`` backend accepts no Inductor ``mode``/``options`` (TypeError) and no ``dynamic=True``
(NotImplementedError); without a backend argument TorchTPU picks ``tpu`` for TPU inputs and Inductor otherwise.
CUDA graphs have no TPU meaning: XLA compiles whole graphs, which is what ``torch.compile`` already gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.cstnodes import string_like
from tpu_agent.migrate.model import ApiEquivalent, Safety, Target
from tpu_agent.migrate.rules._base import Family
from tpu_agent.migrate.rules._cst import arg_source, drop_original_args, replace_original_arg, string_value
from tpu_agent.migrate.rules.references import COMPILE, TORCH_TPU

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

FAMILY = Family("compile")

FAMILY.rule(
    code="TPU501",
    name="compile-cuda-options",
    safety=Safety.SAFE,
    summary="torch.compile arguments TorchTPU rejects: mode=..., options={...}, dynamic=True, "
    'backend="inductor"/"cudagraphs".',
    rationale="The tpu backend raises TypeError on Inductor keywords and NotImplementedError on dynamic=True; modes "
    "such as reduce-overhead are CUDA graphs and max-autotune tunes Triton kernels. Without them torch.compile picks "
    "the right backend for the inputs on every device (TPU target: backend='tpu').",
    before='model = torch.compile(model, mode="max-autotune", dynamic=True)',
    after="model = torch.compile(model)",
    references=(COMPILE, TORCH_TPU),
    apis=(
        ApiEquivalent(
            'torch.compile(model, mode="max-autotune", options={...}, dynamic=True)',
            'torch.compile(model) (--target tpu: backend="tpu")',
        ),
    ),
)
FAMILY.rule(
    code="TPU502",
    name="cuda-graphs",
    safety=Safety.MANUAL,
    summary="CUDA graphs: torch.cuda.CUDAGraph, torch.cuda.graph, make_graphed_callables, graph_pool_handle.",
    rationale="TPU programs are already compiled into whole XLA graphs; capture and replay become "
    'torch.compile(fn, backend="tpu") over the captured region (with static shapes).',
    before="g = torch.cuda.CUDAGraph()\nwith torch.cuda.graph(g):\n    out = model(x)",
    after='step = torch.compile(model, backend="tpu")\nout = step(x)',
    references=(COMPILE,),
    apis=(
        ApiEquivalent(
            "torch.cuda.CUDAGraph, torch.cuda.graph, torch.cuda.make_graphed_callables",
            'torch.compile(fn, backend="tpu") over the captured region',
        ),
    ),
)
FAMILY.rule(
    code="TPU503",
    name="inductor-config",
    safety=Safety.MANUAL,
    summary="torch._inductor.config settings (Triton, CUDA-graph and autotune knobs).",
    rationale="Inductor settings do not reach TorchTPU's XLA backend; TPU compile options go in "
    'torch.compile(..., backend="tpu", options={...}).',
    before="torch._inductor.config.triton.cudagraphs = True",
    after="# TODO(tpu-agent TPU503): no effect on TPU",
    references=(COMPILE,),
    apis=(
        ApiEquivalent(
            "torch._inductor.config",
            'no effect on TPU; TPU options go in torch.compile(..., backend="tpu", options={...})',
        ),
    ),
)

_COMPILE = frozenset({"torch.compile"})
_CUDA_BACKENDS = frozenset({"inductor", "cudagraphs"})
_GRAPH_ADVICE = 'replace capture/replay with torch.compile(fn, backend="tpu") over the captured region'


@FAMILY.leave(cst.Call)
def compile_call(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    if ctx.qualname(original) not in _COMPILE:
        return updated
    drop: set[int] = set()
    backend_index: int | None = None
    for i, arg in enumerate(original.args):
        name = arg.keyword.value if arg.keyword is not None else None
        if name in ("mode", "options"):
            drop.add(i)
        elif name == "dynamic" and isinstance(arg.value, cst.Name) and arg.value.value == "True":
            drop.add(i)
        elif name == "backend" and string_value(arg.value) in _CUDA_BACKENDS:
            if ctx.target is Target.TPU:
                backend_index = i
            else:
                drop.add(i)
    if not drop and backend_index is None:
        return updated
    removed = ", ".join(arg_source(original.args[i]) for i in sorted(drop))

    def build() -> cst.Call:
        new = updated
        if backend_index is not None:
            backend = original.args[backend_index]
            new = replace_original_arg(original, new, backend, string_like(backend.value, "tpu"))
        return drop_original_args(original, new, [original.args[i] for i in sorted(drop)])

    message = f"torch.compile: removed {removed}" if removed else "torch.compile: backend -> 'tpu'"
    new = ctx.fix("TPU501", original, build, lambda n: message)
    return new if new is not None else updated


_GRAPHS = (
    "torch.cuda.CUDAGraph",
    "torch.cuda.graph",
    "torch.cuda.graphs",
    "torch.cuda.make_graphed_callables",
    "torch.cuda.graph_pool_handle",
    "torch.cuda.is_current_stream_capturing",
)


@FAMILY.reference(*_GRAPHS)
def cuda_graph_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    ctx.report("TPU502", original, f"{qualname}: {_GRAPH_ADVICE}")
    return updated


@FAMILY.reference("torch._inductor.config")
def inductor_config_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    ctx.report("TPU503", original, f"{qualname} has no effect on TPU; remove it or guard it for CUDA runs")
    return updated


@FAMILY.leave(cst.Assign)
def inductor_config_assignment(ctx: PyContext, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
    for target in original.targets:
        qualname = ctx.qualname(target.target) if isinstance(target.target, (cst.Attribute, cst.Name)) else None
        if qualname is not None and qualname.startswith("torch._inductor.config."):
            ctx.report("TPU503", target.target, f"{qualname} has no effect on TPU; remove it or guard it for CUDA runs")
    return updated
