"""The migration rules, as data: ``ALL_RULES`` maps each stable code to its :class:`~tpu_agent.migrate.model.Rule`.

Codes are grouped by family: TPU1xx devices, TPU2xx torch.cuda API, TPU3xx AMP, TPU4xx distributed,
TPU5xx compile and CUDA graphs, TPU6xx backend flags, TPU7xx environment variables, TPU8xx third-party and
other manual work. Each family module also registers the handlers the engine dispatches to.
"""

from __future__ import annotations

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.migrate.model import Rule
from tpu_agent.migrate.rules import (
    amp,
    backend_flags,
    compile,
    cuda_api,
    cuda_classes,  # registers its rules and handlers with the cuda-api and backend-flags families
    devices,
    distributed,
    env_vars,
    third_party,
    value_flow,  # registers its rules and handlers with the devices and distributed families
)
from tpu_agent.migrate.rules._base import Family

# Order matters for handlers of the same node type: the device rules see a call before the families that
# drop or rebuild its arguments.
FAMILIES: tuple[Family, ...] = (
    devices.FAMILY,
    cuda_api.FAMILY,
    amp.FAMILY,
    distributed.FAMILY,
    compile.FAMILY,
    backend_flags.FAMILY,
    env_vars.FAMILY,
    third_party.FAMILY,
)

ALL_RULES: dict[str, Rule] = {rule.code: rule for family in FAMILIES for rule in family.rules}


def get_rule(code: str) -> Rule:
    """The rule with ``code`` (case-insensitive), or a TpuAgentError listing how to see the valid codes."""
    rule = ALL_RULES.get(code.upper())
    if rule is None:
        raise TpuAgentError(
            "unknown-rule",
            f"unknown rule code {code!r}",
            hint="run `tpu-agent rules` to list the codes (TPU101 ... TPU809)",
            exit_code=ExitCode.USAGE,
        )
    return rule


__all__ = ["ALL_RULES", "FAMILIES", "get_rule"]
