"""SD-1: parameters + gradients + optimizer state + activations per device against the chip's HBM."""

from __future__ import annotations

from tpu_agent.chips import GIB
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, MemoryBreakdown, ProfileModel, Severity
from tpu_agent.profile.rules._base import MEMORY, DiagnosticRule

ERROR_HBM_SHARE = 0.90  # peak above 90 % of HBM: out of memory or thrashing
WARN_STATE_SHARE = 0.50  # replicated state alone above half of HBM
TARGET_SHARE = 0.70  # plan for 70 % of HBM after sharding
SHARDED_TYPES = ("FullyShardedDataParallel", "FSDP")
NO_DIFF = (
    "sharding changes how the job is launched ({degree} ranks on a device mesh) as well as the script, and a patched "
    "run would be checked on this capture's ranks and chip, where the unsharded state is what does not fit: the "
    "check could not show the fix fits"
)


def plan_shards(memory: MemoryBreakdown, hbm: int) -> tuple[int, bool]:
    """Smallest power-of-two FSDP degree that fits the state in the target, and whether to checkpoint activations."""
    state = memory.param_bytes + memory.grad_bytes + memory.optimizer_bytes
    checkpoint = memory.activation_bytes > 0.3 * hbm
    activations = memory.activation_bytes * (0.25 if checkpoint else 1.0)
    degree = 1
    while degree < 4096 and state / degree + activations > TARGET_SHARE * hbm:
        degree *= 2
    return degree, checkpoint


def fsdp_plan(degree: int, world: int, checkpoint: bool = False) -> str:
    """The FSDP2 code that shards a model over ``degree`` devices (of ``world``): per block, then the root."""
    mesh = (
        f'init_device_mesh("tpu", ({degree},))'
        if degree <= 8 or degree >= world
        else (f'init_device_mesh("tpu", ({max(world // degree, 1)}, {degree}), mesh_dim_names=("replicate", "shard"))')
    )
    plan = (
        f"from torch.distributed.fsdp import fully_shard\n"
        f"from torch.distributed.device_mesh import init_device_mesh\n"
        f"mesh = {mesh}\n"
        f"for block in model.children():  # each transformer block / large layer\n"
        f"    fully_shard(block, mesh=mesh)\n"
        f"fully_shard(model, mesh=mesh)\n"
    )
    if checkpoint:
        plan += "# and wrap each block's forward in torch.utils.checkpoint.checkpoint(...)\n"
    return plan


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    memory = rank.memory
    assert memory is not None  # guaranteed by requires=(MEMORY,)
    if any(t.startswith(SHARDED_TYPES) for t in rank.module_types):
        return []
    chip = model.config.chip
    hbm = chip.hbm_bytes_per_device
    state = memory.param_bytes + memory.grad_bytes + memory.optimizer_bytes
    total = state + memory.activation_bytes
    if total <= ERROR_HBM_SHARE * hbm and state <= WARN_STATE_SHARE * hbm:
        return []
    degree, checkpoint = plan_shards(memory, hbm)
    plan = fsdp_plan(degree, model.config.world_size, checkpoint)
    breakdown = (
        f"params {gib(memory.param_bytes)}, grads {gib(memory.grad_bytes)}, optimizer "
        f"{gib(memory.optimizer_bytes)}, "
        f"activations {gib(memory.activation_bytes)}"
    )
    return [
        RULE.finding(
            f"Replicated model state needs {gib(total)} per device; {chip.device_name} has {gib(hbm)} HBM",
            Evidence("state + activations / HBM per device", round(total / hbm, 3), ERROR_HBM_SHARE, "fraction"),
            [Location.from_site(rank.forward_site)] if rank.forward_site else [],
            f"{breakdown}. Shard parameters, gradients and optimizer state with FSDP2 fully_shard over {degree} "
            "devices "
            f"(`tpu-agent run --nproc {degree}` on one host, more hosts beyond a slice)"
            + (", and checkpoint activations" if checkpoint else "")
            + ". Replicated data parallel (DDP) cannot fit this model.",
            severity=Severity.error if total > ERROR_HBM_SHARE * hbm else Severity.warning,
            agent_change=AgentChange(
                "Shard the model with FSDP2 on a TPU device mesh:\n" + plan,
                no_diff_reason=NO_DIFF.format(degree=degree),
            ),
            saving_pct=0.0,
            confidence=0.85,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="SD-1",
    name="model state beyond HBM",
    category="sharding",
    severity=Severity.error,
    rationale="Each replica holds all parameters, gradients and optimizer state; beyond HBM the job cannot run.",
    before="model = DDP(model)",
    after='mesh = init_device_mesh("tpu", (8,))\nfully_shard(model, mesh=mesh)',
    references=(
        "docs/tpu-performance.md#sharding-and-memory",
        "https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html",
    ),
    requires=(MEMORY,),
    check=_check,
)
