"""The migration rules, as data: ``ALL_RULES`` maps each stable code to its :class:`~tpu_agent.migrate.model.Rule`.

Codes are grouped by family: TPU1xx devices, TPU2xx torch.cuda API, TPU3xx AMP, TPU4xx distributed,
TPU5xx compile and CUDA graphs, TPU6xx backend flags, TPU7xx environment variables, TPU8xx third-party and
other manual work. Each family module also registers the handlers the engine dispatches to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from tpu_agent.errors import ECHO_CHARS, ExitCode, TpuAgentError, clipped
from tpu_agent.migrate.model import MigrateOptions, Rule
from tpu_agent.migrate.rules import (
    accelerator_guards,  # noqa: F401 - registers its handlers with the cuda-api family
    amp,
    backend_flags,
    bind_device,  # noqa: F401 - registers its handlers with the cuda-api family
    compile,
    complex_rotary,  # noqa: F401 - registers the complex rotary rules and handlers with the third-party family
    cuda_api,
    cuda_classes,  # noqa: F401 - registers its rules and handlers with the cuda-api and backend-flags families
    dependencies,  # noqa: F401 - registers its rules and text fixes with the third-party family
    device_count,  # noqa: F401 - registers its rules and handlers with the cuda-api family
    device_tests,  # noqa: F401 - registers its handlers with the devices family
    devices,
    distributed,
    env_vars,
    field_pitfalls,  # noqa: F401 - registers porting pitfalls seen on TorchTPU with the cuda-api, distributed and third-party families
    half_precision,  # noqa: F401 - registers its rule and handlers with the amp family
    init_kwargs,  # noqa: F401 - registers its rule and handlers with the distributed family
    integer_devices,  # noqa: F401 - registers its rule and handlers with the devices family
    library_devices,  # noqa: F401 - registers its rule and handlers with the devices family
    nvtx,  # noqa: F401 - registers its rule and handlers with the cuda-api family
    seeding,  # noqa: F401 - registers its handlers with the cuda-api family
    third_party,
    value_flow,  # noqa: F401 - registers its rules and handlers with the devices and distributed families
    wrappers,  # noqa: F401 - registers its rule and handlers with the distributed family
)
from tpu_agent.migrate.rules._base import Family

# Listed in code order (docs/rules.md follows it). Results do not depend on it: a family that rewrites a
# call's device arguments itself claims the call (Family.claim), and tests/migrate/test_rules.py runs every
# fixture with the families reversed.
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
            f"unknown rule code {clipped(code)}",
            hint="run `tpu-agent rules` to list the codes (TPU101 ... TPU809)",
            exit_code=ExitCode.USAGE,
        )
    return rule


def rule_codes(values: Iterable[str], option: str) -> frozenset[str]:
    """Rule codes or code prefixes as given by a user or an agent, canonical: stripped, upper-cased, each
    matching at least one rule (``tpu1`` -> ``TPU1``; ``TPU9``, a typo, is refused by name rather than
    silently selecting nothing). ``option`` names the argument in the error (``--select``, ``select``)."""
    prefixes = frozenset(value.strip().upper() for value in values if value.strip())
    if not prefixes:
        raise TpuAgentError(
            "bad-rule-selection",
            f"{option} needs at least one rule code or prefix",
            f"Example: {option} TPU1,TPU201 (run `tpu-agent rules` to list the codes).",
            exit_code=ExitCode.USAGE,
        )
    unknown = sorted(prefix for prefix in prefixes if not any(code.startswith(prefix) for code in ALL_RULES))
    if unknown:
        these = "these" if len(unknown) > 1 else "this"
        raise TpuAgentError(
            "unknown-rule",
            f"unknown rule code {', '.join(unknown)[:ECHO_CHARS]} in {option}: no rule code starts with {these}",
            "Run `tpu-agent rules` to list the rule codes (TPU101 ... TPU809); prefixes such as TPU2 select a family.",
            exit_code=ExitCode.USAGE,
        )
    return prefixes


def with_rule_selection(options: MigrateOptions) -> MigrateOptions:
    """``options`` with canonical ``select``/``ignore`` (see :func:`rule_codes`); every front end's options
    pass through here in :func:`tpu_agent.migrate.api.plan`, so the CLI and the MCP server agree."""
    select = rule_codes(options.select, "select") if options.select is not None else None
    ignore = rule_codes(options.ignore, "ignore") if options.ignore else frozenset()
    if select == options.select and ignore == options.ignore:
        return options
    return dataclasses.replace(options, select=select, ignore=ignore)


__all__ = ["ALL_RULES", "FAMILIES", "get_rule", "rule_codes", "with_rule_selection"]
