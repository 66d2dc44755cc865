"""TorchTPU's eager-mode switches are read once, by ``runtime.envvars``: the launcher, ``doctor``, the emulation's
activation and the profile's CAP-6 rule must agree on what an environment means.

Two readers once disagreed: ``TORCH_TPU_LAUNCH_BLOCKING=true`` was Debug Eager to one and Strict Eager to the
other, and a legacy ``TPU_LAUNCH_BLOCKING=1`` overrode ``TORCH_TPU_LAUNCH_BLOCKING=0`` in one of them.
"""

from __future__ import annotations

import pytest
from runtime_launch_util import run_script

from tpu_agent.chips import get_chip
from tpu_agent.profile.model import ProfileModel, RankProfile, RunConfig
from tpu_agent.profile.rules import cap_debug_mode
from tpu_agent.runtime.envvars import EAGER_MODES, debug_checks_from_env, eager_mode_env, eager_mode_from_env

# (environment, the mode it selects, the variable that decided it)
CASES = [
    ({"TORCH_TPU_LAUNCH_BLOCKING": "true"}, "debug", "TORCH_TPU_LAUNCH_BLOCKING=true"),
    ({"TORCH_TPU_LAUNCH_BLOCKING": "0", "TPU_LAUNCH_BLOCKING": "1"}, "strict", None),  # the new name wins
    ({"TPU_LAUNCH_BLOCKING": "1"}, "debug", "TPU_LAUNCH_BLOCKING=1"),  # the legacy name, when alone, still counts
    ({"TORCH_TPU_DEFER_AND_FUSE": "On", "TORCH_TPU_LAUNCH_BLOCKING": "yes"}, "debug", "TORCH_TPU_LAUNCH_BLOCKING=yes"),
    ({"TORCH_TPU_DEFER_AND_FUSE": "false", "TPU_DEFER_AND_FUSE": "1"}, "strict", None),
    ({"TPU_DEFER_AND_FUSE": "1"}, "defer-and-fuse", "TPU_DEFER_AND_FUSE=1"),
]


@pytest.mark.parametrize(("env", "mode", "source"), CASES)
def test_eager_mode_from_env_reads_each_switch_once_with_the_new_name_first(
    env: dict[str, str], mode: str, source: str | None
) -> None:
    chosen, why = eager_mode_from_env(env)
    assert chosen is EAGER_MODES[mode]
    assert why == source if source is not None else why.startswith("default")


def test_debug_checks_follow_the_mode_unless_their_own_switch_is_set() -> None:
    assert debug_checks_from_env({}, launch_blocking=True)
    assert not debug_checks_from_env({}, launch_blocking=False)
    override_off = {"TORCH_TPU_ENABLE_DEBUG_CHECKS": "0", "TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS": "1"}
    assert not debug_checks_from_env(override_off, launch_blocking=True)
    assert debug_checks_from_env({"TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS": "true"}, launch_blocking=False)


def test_a_chosen_mode_removes_every_spelling_of_both_switches() -> None:
    updates = eager_mode_env("defer-and-fuse")
    assert updates["TORCH_TPU_DEFER_AND_FUSE"] == "1"
    removed = {"TORCH_TPU_LAUNCH_BLOCKING", "TPU_LAUNCH_BLOCKING", "TPU_DEFER_AND_FUSE"}
    assert all(updates[name] is None for name in removed)


ACTIVATE = r"""
import json
from tpu_agent.runtime.emulated import activate, state
activate()  # no explicit mode: the environment's, as a plain `python script.py` under the runtime gets
print(json.dumps([state.eager_mode.value, state.debug_checks]))
"""


@pytest.mark.parametrize(("env", "mode"), [(CASES[0][0], "debug"), (CASES[1][0], "strict")])
def test_the_emulation_doctor_and_cap6_read_the_same_environment_alike(tmp_path, env, mode) -> None:
    option = EAGER_MODES[mode]
    applied, checks = run_script(ACTIVATE, tmp_path, **env)
    assert applied == eager_mode_from_env(env)[0].enum_name == option.enum_name
    assert checks == (mode == "debug")
    model = ProfileModel(RunConfig(chip=get_chip("v5e"), eager_mode=applied, env=env), {0: RankProfile(rank=0)})
    findings = cap_debug_mode.RULE.check(model)
    if mode == "debug":
        assert [f.title for f in findings] == [f"Debug settings are on: {next(iter(env))}={next(iter(env.values()))}"]
    else:
        assert findings == []
