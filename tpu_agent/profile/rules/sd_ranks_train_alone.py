"""SD-7: a multi-rank training run in which no rank ran a collective: each rank trained its own model.

Under ``tpu-agent run --nproc N`` every rank runs the script; without DDP, FSDP or an ``all_reduce`` of the
gradients nothing joins them (a forgotten wrapper, or Hugging Face ``Trainer``, whose accelerate knows no backend
for ``tpu``). The runtime warns at the first optimizer step; this is the same verdict in the report that agents
read, from the ranks' event logs.
"""

from __future__ import annotations

from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule
from tpu_agent.runtime import events as ev


def _check(model: ProfileModel) -> list[Finding]:
    if model.config.world_size < 2:
        return []
    ranks = model.ranks.values()
    training = any(step.source == "optimizer" for rank in ranks for step in rank.steps)
    if not training or any(isinstance(e, ev.Collective) for rank in ranks for e in rank.events):
        return []
    rank = model.primary
    return [
        RULE.finding(
            f"None of the {model.config.world_size} ranks ran a collective: each trained its own copy of the model",
            Evidence("collectives over the run, all ranks", 0, 1, "collectives"),
            [Location.from_site(rank.step_site)] if rank.step_site else [],
            "Nothing averaged the gradients across ranks. Wrap the model in DistributedDataParallel (or FSDP2 "
            'fully_shard) after dist.init_process_group("tpu_dist"), or all_reduce the gradients before the '
            "optimizer step. Hugging Face Trainer does not know tpu_dist yet and trains this way; run it as one "
            "process, or write the loop. Ignore this if the ranks are meant to train independently.",
            agent_change=AgentChange(
                'Call dist.init_process_group("tpu_dist") and wrap the model in '
                "torch.nn.parallel.DistributedDataParallel(model) before the training loop."
            ),
            confidence=0.8,
        )
    ]


RULE = DiagnosticRule(
    code="SD-7",
    name="ranks-train-alone",
    category="sharding",
    severity=Severity.warning,
    rationale="Ranks whose gradients are never averaged train N unrelated models on N shards of the data.",
    before="model = Net().to(device)  # under tpu-agent run --nproc 2",
    after='dist.init_process_group("tpu_dist")\nmodel = DistributedDataParallel(Net().to(device))',
    references=(
        "docs/tpu-performance.md#sharding-and-memory",
        "https://pytorch.org/docs/stable/notes/ddp.html",
    ),
    requires=(STEPS, HOOKS),
    check=_check,
)
