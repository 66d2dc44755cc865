"""Estimate's defaults and bounds have one owner (``tpu_agent.estimate.options``): the CLI, the MCP tool and the
library options all offer and refuse the same values."""

from __future__ import annotations

import inspect
import typing

import pytest
from pydantic import TypeAdapter

from tpu_agent.errors import TpuAgentError
from tpu_agent.estimate.options import (
    DEFAULT_EFFORT,
    DEFAULT_OPTIMIZER_STEPS,
    DEFAULT_TARGET,
    EFFORTS,
    MAX_OPTIMIZER_STEPS,
    MIN_OPTIMIZER_STEPS,
    STRATEGIES,
)
from tpu_agent.estimate.script import EstimateOptions


@pytest.mark.parametrize("steps", [MIN_OPTIMIZER_STEPS - 1, MAX_OPTIMIZER_STEPS + 1])
def test_steps_outside_the_bounds_are_refused_with_them(steps: int) -> None:
    with pytest.raises(TpuAgentError) as error:
        EstimateOptions(DEFAULT_TARGET, steps=steps).check()
    assert error.value.code == "bad-steps"
    assert f"{MIN_OPTIMIZER_STEPS} to {MAX_OPTIMIZER_STEPS}" in error.value.message
    assert error.value.hint == f"use --steps {DEFAULT_OPTIMIZER_STEPS}"


def test_an_unknown_effort_is_refused_with_the_list() -> None:
    with pytest.raises(TpuAgentError) as error:
        EstimateOptions(DEFAULT_TARGET, effort="heroic").check()
    assert error.value.code == "bad-effort" and error.value.hint == f"use one of: {', '.join(EFFORTS)}"


def test_an_unknown_strategy_is_refused_with_the_list() -> None:
    with pytest.raises(TpuAgentError) as error:
        EstimateOptions(DEFAULT_TARGET, strategy="pipeline").check()
    assert error.value.code == "bad-strategy" and error.value.hint == f"use one of: {', '.join(STRATEGIES)}"


def test_the_mcp_tool_and_the_cli_offer_the_owners_defaults_and_bounds() -> None:
    from tpu_agent.cli.estimate import estimate
    from tpu_agent.plugins.tools.jobs import tpu_estimate

    hints = typing.get_type_hints(tpu_estimate, include_extras=True)
    tool = inspect.signature(tpu_estimate).parameters
    steps = TypeAdapter(hints["steps"]).json_schema()
    assert (steps["minimum"], steps["maximum"]) == (MIN_OPTIMIZER_STEPS, MAX_OPTIMIZER_STEPS)
    assert tool["steps"].default == DEFAULT_OPTIMIZER_STEPS and tool["chip"].default == DEFAULT_TARGET
    strategies = TypeAdapter(hints["strategy"]).json_schema()["anyOf"][0]["enum"]
    assert tuple(strategies) == STRATEGIES
    assert tuple(TypeAdapter(hints["effort"]).json_schema()["enum"]) == EFFORTS
    cli = inspect.signature(estimate).parameters
    assert cli["steps"].default.default == DEFAULT_OPTIMIZER_STEPS and cli["chip"].default.default == DEFAULT_TARGET
    assert tool["effort"].default == cli["effort"].default.default == DEFAULT_EFFORT
