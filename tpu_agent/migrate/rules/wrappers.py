"""TPU409: FSDP1's ``FullyShardedDataParallel`` wrapper, which TorchTPU does not document.

TorchTPU documents DDP, FSDP2 (``torch.distributed.fsdp.fully_shard`` with ``MixedPrecisionPolicy``) and DTensor
over ``tpu_dist``; FSDP1 is deprecated upstream in favour of FSDP2 and unverified on a TPU host (tpu-agent's own
emulation runs it, offloaded full state dicts included, which says nothing about real TorchTPU). The port is a
restructuring (one ``fully_shard`` per block instead of an auto-wrap policy, a different state-dict API), so the
rule is manual: each construction site is reported once, with the FSDP2 spelling of the arguments it passes.
``FSDP.state_dict_type(...)`` and the import are not construction sites; the finding names the state-dict port
when the module uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules.distributed import FAMILY
from tpu_agent.migrate.rules.references import FSDP2, TORCH_TPU

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
    summary="torch.distributed.fsdp.FullyShardedDataParallel(...) (FSDP1) where a model is wrapped.",
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
        ApiEquivalent(_FSDP1_STATE_DICT, _STATE_DICT),
    ),
)

_FSDP1 = frozenset(
    {
        "torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
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
    "FSDP1 is deprecated upstream and unverified on TorchTPU, which documents FSDP2 (torch.distributed.fsdp."
    "fully_shard) and DTensor over tpu_dist"
)


@FAMILY.leave(cst.Call)
def fsdp1_wrapper(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    if ctx.qualname(original) not in _FSDP1:
        return updated
    passed = {arg.keyword.value for arg in original.args if arg.keyword is not None}
    advice = [] if "auto_wrap_policy" in passed else ["fully_shard(model)"]
    advice += [text for name, text in _ARGUMENTS.items() if name in passed]
    if "state_dict_type" in ctx.source:
        advice.append(f"save with {_STATE_DICT} in place of {_FSDP1_STATE_DICT}")
    ctx.report("TPU409", original, f"{_WHY}. Port by hand: {'; '.join(advice)}", fixable=False)
    return updated
