"""TPU810/TPU811: CUDA-only packages and CUDA wheel indexes in dependency files.

``requirements*.txt``, ``constraints*.txt``, ``pyproject.toml``, ``setup.cfg``, ``Pipfile`` and conda
``environment.yml`` files are read line by line; ``setup.py`` through its ``setup(install_requires=...,
extras_require=...)`` call. Each CUDA-only package is reported with what a TPU install uses instead (usually:
nothing, or ``torch_tpu``). Nothing is removed automatically: the code that imports the package is reported
by the other third-party rules, and dropping a requirement before that code is ported would break installs
on CUDA machines too.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, FileKind, Safety
from tpu_agent.migrate.rules._base import TextFix
from tpu_agent.migrate.rules._cst import string_value
from tpu_agent.migrate.rules.references import CLOUD_TPU_PYTORCH, SDPA, TORCH_TPU
from tpu_agent.migrate.rules.third_party import FAMILY

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

FAMILY.rule(
    code="TPU810",
    name="cuda-only-package",
    safety=Safety.MANUAL,
    summary="A CUDA-only package in a dependency file: nvidia-*, cupy-cuda*, flash-attn, xformers, bitsandbytes, "
    "triton, apex, pynvml, cudatoolkit / pytorch-cuda.",
    rationale="These wheels need an NVIDIA GPU (or only make sense with one). A TPU install drops them and adds "
    "torch_tpu; each finding says what replaces the package's job.",
    before="flash-attn>=2.5\nnvidia-nccl-cu12==2.20.5",
    after="# flash-attn: drop (F.scaled_dot_product_attention); nvidia-nccl-cu12: drop (TPU collectives use tpu_dist)",
    references=(CLOUD_TPU_PYTORCH, TORCH_TPU),
    apis=(
        ApiEquivalent("flash-attn, xformers", "drop: torch.nn.functional.scaled_dot_product_attention"),
        ApiEquivalent("nvidia-* (cudnn, nccl, cublas ...), cudatoolkit, pytorch-cuda", "drop; install torch_tpu"),
        ApiEquivalent("cupy-cuda12x", "numpy on the host, torch ops on the device"),
    ),
)
FAMILY.rule(
    code="TPU811",
    name="cuda-wheel-index",
    safety=Safety.MANUAL,
    summary="A CUDA build of torch: torch==2.3.1+cu121, --extra-index-url https://download.pytorch.org/whl/cu121.",
    rationale="CUDA wheels bundle CUDA libraries a TPU host cannot use. A TPU host installs the plain torch release "
    "TorchTPU supports (from PyPI or the CPU index) plus torch_tpu.",
    before="--extra-index-url https://download.pytorch.org/whl/cu121\ntorch==2.3.1+cu121",
    after="torch==2.3.1  # plus torch_tpu on TPU hosts",
    references=(CLOUD_TPU_PYTORCH, TORCH_TPU),
    apis=(ApiEquivalent("torch==X+cu121, download.pytorch.org/whl/cu121", "torch==X from PyPI plus torch_tpu"),),
)

_DROP_SDPA = f"drop it: TorchTPU runs torch.nn.functional.scaled_dot_product_attention ({SDPA})"
# package name pattern -> what a TPU install does instead
_PACKAGES: tuple[tuple[str, str], ...] = (
    (r"nvidia-ml-py3?|pynvml|gputil", "drop it: NVML has no TPU meaning (tpu-agent profile reads TPU utilisation)"),
    (r"nvidia-dali(?:-cuda\d+)?", "use torch.utils.data / torchvision transforms on the host"),
    (r"nvidia-[a-z0-9][a-z0-9-]*", "drop it: a CUDA runtime library; TPU hosts install torch_tpu instead"),
    (r"cupy-cuda[0-9x]+|cupy", "use numpy on the host or torch ops on the device"),
    (r"flash[-_]attn", _DROP_SDPA),
    (r"xformers", _DROP_SDPA),
    (r"bitsandbytes", "no TPU build: drop 8-bit optimisers/quantisation or use torchao"),
    (r"triton", "drop it: Triton kernels are CUDA-only (port hot kernels to Pallas)"),
    (r"apex", "drop it: use torch.autocast, torch.optim fused optimizers and DistributedDataParallel"),
    (r"cudatoolkit|pytorch-cuda|cuda-toolkit|cuda-python|cuda-nvcc", "drop it: no CUDA toolkit on a TPU host"),
)
_NAME_BEFORE = r"(?:^|(?<=[\s\"'\[,(=]))"
_NAME_AFTER = r"(?=\s*(?:[<>=!~;\[\]\"',)#@]|$))"
_PACKAGE_RE = re.compile(
    _NAME_BEFORE + r"(?:" + "|".join(f"(?P<p{i}>{p})" for i, (p, _) in enumerate(_PACKAGES)) + r")" + _NAME_AFTER,
    re.IGNORECASE,
)
_CUDA_TORCH_RE = re.compile(r"\b(?:torch|torchvision|torchaudio)\s*==\s*[\w.]+\+cu\d+", re.IGNORECASE)
_CUDA_INDEX_RE = re.compile(r"https?://download\.pytorch\.org/whl/(?:nightly/)?cu\d+\S*", re.IGNORECASE)
_KINDS = frozenset({FileKind.DEPENDENCIES, FileKind.YAML})


def package_advice(match: re.Match[str]) -> str:
    """What a TPU install does instead of the package ``match`` (of :data:`_PACKAGE_RE`) names."""
    index = int(next(name for name, value in match.groupdict().items() if value is not None)[1:])
    return f"{match.group(0)} (CUDA-only): {_PACKAGES[index][1]}"


FAMILY.text(
    TextFix(
        code="TPU810",
        kinds=_KINDS,
        pattern=_PACKAGE_RE,
        replace=lambda ctx, m: None,
        message=lambda ctx, m: package_advice(m),
    )
)
FAMILY.text(
    TextFix(
        code="TPU811",
        kinds=_KINDS,
        pattern=_CUDA_TORCH_RE,
        replace=lambda ctx, m: None,
        message=lambda ctx, m: (
            f"{m.group(0)} is a CUDA build: pin the plain release ({m.group(0).split('+')[0]}) "
            "and add torch_tpu on TPU hosts"
        ),
    )
)
FAMILY.text(
    TextFix(
        code="TPU811",
        kinds=_KINDS,
        pattern=_CUDA_INDEX_RE,
        replace=lambda ctx, m: None,
        message=lambda ctx, m: (
            f"CUDA wheel index {m.group(0)}: use PyPI (or https://download.pytorch.org/whl/cpu) on TPU hosts"
        ),
    )
)

_SETUP_CALLS = frozenset({"setuptools.setup", "distutils.core.setup", "setup"})
_REQUIREMENT_KEYWORDS = frozenset({"install_requires", "extras_require", "setup_requires", "tests_require"})


@FAMILY.leave(cst.Call)
def setup_requirements(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    """``setup(install_requires=["flash-attn>=2", ...])`` in setup.py: each CUDA-only requirement string."""
    func = original.func
    name = ctx.qualname(original) or (func.value if isinstance(func, cst.Name) else None)
    if name not in _SETUP_CALLS:
        return updated
    for arg in original.args:
        if arg.keyword is not None and arg.keyword.value in _REQUIREMENT_KEYWORDS:
            for string in _strings(arg.value):
                _report_requirement(ctx, string)
    return updated


def _strings(node: cst.CSTNode) -> list[cst.SimpleString]:
    """The string literals of a requirements list, tuple or dict of lists."""
    if isinstance(node, cst.SimpleString):
        return [node]
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        return [s for el in node.elements for s in _strings(el.value)]
    if isinstance(node, cst.Dict):
        return [s for el in node.elements if isinstance(el, cst.DictElement) for s in _strings(el.value)]
    return []


def _report_requirement(ctx: PyContext, string: cst.SimpleString) -> None:
    value = string_value(string) or ""
    package = _PACKAGE_RE.match(value.strip())
    if package is not None:
        ctx.report("TPU810", string, package_advice(package))
    elif _CUDA_TORCH_RE.search(value):
        ctx.report("TPU811", string, f"{value} is a CUDA build: pin the plain release and add torch_tpu on TPU hosts")
