"""TPU409: FSDP1's ``FullyShardedDataParallel`` wrapper, which TorchTPU does not document; TPU410: the
``SyncBatchNorm`` conversion, whose cross-replica statistics are unverified on TorchTPU.

TorchTPU documents DDP, FSDP2 (``torch.distributed.fsdp.fully_shard`` with ``MixedPrecisionPolicy``) and DTensor
over ``tpu_dist``; FSDP1 is deprecated upstream in favour of FSDP2 and unverified on a TPU host (tpu-agent's own
emulation runs it, offloaded full state dicts included, which says nothing about real TorchTPU). The port is a
restructuring (one ``fully_shard`` per block instead of an auto-wrap policy, a different state-dict API), so the
rule is manual: each construction site is reported once, with the FSDP2 spelling of the arguments it passes.
Real FSDP1 code often never calls the class where it names it: it hands the class to something that calls it
later, ``functools.partial(FSDP, sharding_strategy=...)`` (a wrapper built once, applied per model),
``enable_wrap(wrapper_cls=FSDP, **cfg)`` with ``wrap(block)`` inside (fairseq), ``wrap(m, wrapper_cls=FSDP)``,
``FSDP if cfg.fsdp else DDP``, ``class ShardedModel(FSDP)``. The class handed over is that construction site (a
call's other keywords being the FSDP1 arguments). fairscale's FullyShardedDataParallel, which FSDP1 grew from and
which ESM and fairseq still wrap with, is ported the same way.
``FSDP.state_dict_type(...)``, ``isinstance(m, FSDP)`` and the import are not construction sites; the finding
names the state-dict port when the module uses it.

``nn.SyncBatchNorm.convert_sync_batchnorm(model)`` (DINO, timm's --sync-bn) gathers batch statistics across
ranks with ``batch_norm_stats`` and ``batch_norm_gather_stats_with_counts``, kernels CUDA has and TorchTPU does not
document (the CPU emulation has no kernel for them, so a run fails there): reported where a model is converted or
the layer built, not where ``isinstance`` names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules._cst import source
from tpu_agent.migrate.rules.distributed import FAMILY
from tpu_agent.migrate.rules.references import DDP, FSDP2, TORCH_TPU

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

_STATE_DICT = (
    "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)) "
    "(torch.distributed.checkpoint.state_dict)"
)
_FSDP1_STATE_DICT = "FSDP.state_dict_type(model, FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True, ...))"

FAMILY.rule(
    code="TPU409",
    name="fsdp1-wrapper",
    safety=Safety.MANUAL,
    summary="torch.distributed.fsdp.FullyShardedDataParallel (FSDP1, or fairscale's) where a model is wrapped: FSDP(...), "
    "partial(FSDP, ...), enable_wrap(wrapper_cls=FSDP, ...), wrap(m, wrapper_cls=FSDP).",
    rationale="TorchTPU documents DDP, FSDP2 (torch.distributed.fsdp.fully_shard with MixedPrecisionPolicy) and "
    "DTensor over tpu_dist; FSDP1 is deprecated upstream in favour of FSDP2 and unverified on TorchTPU. Reported, "
    "not rewritten: FSDP2 shards each block with its own fully_shard call instead of an auto-wrap policy, and "
    "saves through torch.distributed.checkpoint.state_dict instead of FSDP.state_dict_type.",
    before="model = FSDP(model, auto_wrap_policy=policy, mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))\n"
    "with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True)):\n"
    "    state = model.state_dict()",
    after="mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)\n"
    "for block in model.layers:\n"
    "    fully_shard(block, mp_policy=mp)\n"
    "fully_shard(model, mp_policy=mp)\n"
    "state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))",
    references=(FSDP2, TORCH_TPU),
    apis=(
        ApiEquivalent(
            "FullyShardedDataParallel(model, auto_wrap_policy=...)",
            "fully_shard(block) per block, then fully_shard(model)",
        ),
        ApiEquivalent(
            "FullyShardedDataParallel(..., mixed_precision=MixedPrecision(...))",
            "fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))",
        ),
        ApiEquivalent(
            "functools.partial(FSDP, ...), enable_wrap(wrapper_cls=FSDP, ...) with wrap(block) inside",
            "fully_shard(block, ...) where each block would be wrapped, then fully_shard(model, ...)",
        ),
        ApiEquivalent(_FSDP1_STATE_DICT, _STATE_DICT),
    ),
)

# torch's FSDP1, and fairscale's FSDP it grew from (ESM and fairseq wrap with it; it drives CUDA streams itself)
_FSDP1 = frozenset(
    {
        "torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
        "fairscale.nn.FullyShardedDataParallel",
        "fairscale.nn.data_parallel.FullyShardedDataParallel",
        "fairscale.nn.data_parallel.fully_sharded_data_parallel.FullyShardedDataParallel",
    }
)
# what each FSDP1 argument becomes under FSDP2 (an argument not listed here needs no advice of its own)
_ARGUMENTS = {
    "auto_wrap_policy": "fully_shard(block) for each block the auto_wrap_policy wraps, then fully_shard(model)",
    "mixed_precision": "mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) in "
    "place of mixed_precision=MixedPrecision(...)",
    "sharding_strategy": "reshard_after_forward=True for FULL_SHARD (False for SHARD_GRAD_OP; HYBRID_SHARD is a "
    "2-D mesh) in place of sharding_strategy",
    "device_id": "no device_id (fully_shard's default mesh spans the accelerator in use, one device per process)",
    "cpu_offload": "offload_policy=CPUOffloadPolicy() in place of cpu_offload",
}
_WHY = (
    "FSDP1 (torch's, or fairscale's before it) is deprecated upstream and unverified on TorchTPU, which documents "
    "FSDP2 (torch.distributed.fsdp.fully_shard) and DTensor over tpu_dist"
)


FAMILY.rule(
    code="TPU410",
    name="sync-batchnorm",
    safety=Safety.MANUAL,
    summary="torch.nn.SyncBatchNorm: convert_sync_batchnorm(model) or SyncBatchNorm(...) where a model gets it.",
    rationale="SyncBatchNorm all-gathers batch statistics through batch_norm_stats and "
    "batch_norm_gather_stats_with_counts, kernels CUDA provides and TorchTPU does not document (tpu-agent's CPU "
    "emulation has none, so the run stops there). Reported, not rewritten: keeping per-replica BatchNorm changes "
    "the statistics with the per-device batch size, which a person weighs (or verifies SyncBatchNorm on a TPU host).",
    before="model = nn.SyncBatchNorm.convert_sync_batchnorm(model)",
    after="# per-replica BatchNorm (drop the conversion), or GroupNorm/LayerNorm in the model",
    references=(DDP, TORCH_TPU),
    apis=(
        ApiEquivalent(
            "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model), torch.nn.SyncBatchNorm(num_features)",
            "per-replica torch.nn.BatchNorm (no conversion), or verify SyncBatchNorm on a TPU host",
        ),
    ),
)
_SYNC_BN = frozenset(
    {
        "torch.nn.SyncBatchNorm",
        "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
        "torch.nn.modules.batchnorm.SyncBatchNorm",
        "torch.nn.modules.batchnorm.SyncBatchNorm.convert_sync_batchnorm",
    }
)


@FAMILY.leave(cst.Call)
def sync_batchnorm(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    if ctx.qualname(original) in _SYNC_BN:
        ctx.report(
            "TPU410",
            original,
            f"{source(original)}: SyncBatchNorm's cross-replica statistics (batch_norm_stats, "
            "batch_norm_gather_stats_with_counts) are unverified on TorchTPU: keep per-replica BatchNorm (drop "
            "the conversion) or verify on a TPU host",
            fixable=False,
        )
    return updated


# builtins that test a class rather than construct it (``isinstance(model, FSDP)``)
_CLASS_TESTS = frozenset({"isinstance", "issubclass"})


@FAMILY.leave(cst.Call)
def fsdp1_wrapper(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    if ctx.qualname(original) in _FSDP1:
        _report(ctx, original.args, original, "")
    elif not (isinstance(original.func, cst.Name) and original.func.value in _CLASS_TESTS):
        for arg in original.args:
            if _is_fsdp1(ctx, arg.value):
                _report(ctx, original.args, arg.value, f"passed to {source(original.func)}")
    return updated


@FAMILY.visit(cst.IfExp)
def fsdp1_chosen(ctx: PyContext, node: cst.IfExp) -> None:
    """``wrapper_cls = FSDP if cfg.fsdp else DDP``: the class chosen here is called where the choice is."""
    for branch in (node.body, node.orelse):
        if _is_fsdp1(ctx, branch):
            _report(ctx, (), branch, "chosen by a conditional expression")


@FAMILY.visit(cst.ClassDef)
def fsdp1_subclass(ctx: PyContext, node: cst.ClassDef) -> None:
    """``class ShardedModel(FSDP)``: each construction of the subclass is one of FSDP1."""
    for base in node.bases:
        if _is_fsdp1(ctx, base.value):
            _report(ctx, (), base.value, f"subclassed by {node.name.value}")


def _is_fsdp1(ctx: PyContext, node: cst.BaseExpression) -> bool:
    """Whether ``node`` names the FSDP1 class itself (not a call of it, not one of its attributes)."""
    return isinstance(node, (cst.Name, cst.Attribute)) and ctx.qualname(node) in _FSDP1


def _report(ctx: PyContext, args: Sequence[cst.Arg], site: cst.CSTNode, handed: str) -> None:
    """One finding at ``site`` with the FSDP2 spelling of the FSDP1 arguments in ``args`` (the construction's,
    or those of the partial/enable_wrap/wrap call the class is ``handed`` to, which construct it later)."""
    passed = {arg.keyword.value for arg in args if arg.keyword is not None}
    whole = "fully_shard(module) for each module it wraps, then fully_shard(model)" if handed else "fully_shard(model)"
    advice = [] if "auto_wrap_policy" in passed else [whole]
    advice += [text for name, text in _ARGUMENTS.items() if name in passed]
    if ctx.mentions("state_dict_type"):
        advice.append(f"save with {_STATE_DICT} in place of {_FSDP1_STATE_DICT}")
    where = f"{source(site)} {handed} wraps modules in FSDP1 where it is called. " if handed else ""
    ctx.report("TPU409", site, f"{_WHY}. {where}Port by hand: {'; '.join(advice)}", fixable=False)
