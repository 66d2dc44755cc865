"""EM-3: the step runs eagerly with nothing compiled; names the region to wrap in torch.compile.

When the script already compiles the model behind a switch (nanoGPT's ``if compile:``), the fix is the switch
(``--compile=True``), not a second torch.compile; otherwise the new line goes where it runs on every path.
"""

from __future__ import annotations

import re

from tpu_agent.profile import compile_site, patches
from tpu_agent.profile.amp_context import setting_seen_at
from tpu_agent.profile.flags import argparse_flag, command_line_value
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, RunConfig, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule, ops_per_step
from tpu_agent.profile.sources import function_at
from tpu_agent.runtime import events as ev

OPS_THRESHOLD = 50
COMPILE = 'torch.compile(backend="tpu")'


def _def_line(path: str, function: str, before_line: int) -> int | None:
    for line in range(before_line, 0, -1):
        if re.match(rf"\s*(async\s+)?def\s+{re.escape(function)}\s*\(", patches.line_text(path, line) + " "):
            return line
    return None


def _switch_advice(path: str, call: compile_site.CompileCall, config: RunConfig) -> tuple[str, str | None, int | None]:
    """Why the existing compile did not run and how to turn it on: the flag this run passed, the config file
    or the setting that switched it off. Returns the advice, a diff (a setting written in the script) and the
    line of that setting."""
    name = patches.display_path(path)
    wanted = "True" if call.runs_when else "False"
    switch = call.switch
    if switch is None:
        return f"; `{call.condition}` was {str(not call.runs_when).lower()} in this run.", None, None
    declared = argparse_flag(path, switch)
    if declared is not None:  # a flag without a value (--no-compile): --switch=value would be refused
        return f"; {declared.advice(call.runs_when, config.script_args)}.", None, declared.line
    override = command_line_value(config.script_args, switch)
    flag = switch
    if override is None and "_" in switch:
        flag = switch.replace("_", "-")
        override = command_line_value(config.script_args, flag)
    if override is not None:
        return f"; this run set --{flag}={override}: run with --{flag}={wanted}.", None, None
    configured = compile_site.config_file_setting(config.script or path, config.script_args, switch)
    if configured is not None:
        where, line, value = configured
        return (
            f"; {where}:{line} sets `{switch} = {value}`: set it to {wanted} there or run with --{switch}={wanted}.",
            None,
            None,
        )
    setting = setting_seen_at(path, switch, call.line)
    if setting is not None and setting.source in ("True", "False") and setting.source != wanted:
        diff = patches.replace_on_line(
            path, setting.line, rf"(\b{re.escape(switch)}\s*=\s*){setting.source}\b", rf"\g<1>{wanted}"
        )
        return f"; `{switch} = {setting.source}` ({name}:{setting.line}): set it to {wanted}.", diff, setting.line
    return (
        f"; `{switch}` was {str(not call.runs_when).lower()} in this run: make it {wanted} "
        f"(--{switch}={wanted} where the script takes overrides).",
        None,
        setting.line if setting is not None else None,
    )


def _existing_change(path: str, call: compile_site.CompileCall, config: RunConfig) -> tuple[str, str | None, list[int]]:
    """The advice for a script that already compiles the model (the call, its switch, its options)."""
    name = patches.display_path(path)
    lines = [call.line]
    if call.condition is None:
        description, diff = (
            f"{name}:{call.line} already compiles the model (`{call.call}`), yet nothing was compiled in this run: "
            "that line did not run before the step, or the step calls the uncompiled model.",
            None,
        )
    else:
        test = f"`{call.switch}`" if call.switch else f"`{call.condition}`"
        advice, diff, setting_line = _switch_advice(path, call, config)
        description = (
            f"{name}:{call.line} already compiles the model (`{call.call}`) when {test} is "
            f"{str(call.runs_when).lower()}{advice}"
        )
        lines += [setting_line] if setting_line else []
    if call.refused:
        description += f" That call passes {', '.join(call.refused)}, which TorchTPU's backend refuses: drop " + (
            "it." if len(call.refused) == 1 else "them."
        )
        diff = compile_site.drop_refused(path, call) or diff
    elif call.backend is None:
        description += ' It names no backend: TorchTPU picks backend="tpu" for TPU inputs, so it needs no change.'
    return description, diff, lines


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    if any(isinstance(e, (ev.Compile, ev.GraphBreak)) for e in rank.events):
        return []
    count = ops_per_step(rank)
    if count < OPS_THRESHOLD:
        return []
    site = rank.step_site or rank.forward_site
    if site is None:
        return []
    model_class = rank.module_types[0] if rank.module_types else None
    built = compile_site.model_construction(site.file, model_class, site.line) if model_class else None
    names = {built.variable} if built else set()
    step_function = site.function != "<module>" and not patches.in_loop(site.file, site.line)
    existing = compile_site.existing_compile(site.file, names | ({site.function} if step_function else set()))
    locations = [Location.from_site(site)]
    if step_function:
        region = f"the step function `{site.function}`"
    else:
        called_at = f"{patches.display_path(site.file)}:{(rank.forward_site or site).line}"
        region = f"the {model_class or 'model'} model (called at {called_at})"
    if existing is not None:
        description, diff, lines = _existing_change(site.file, existing, model.config)
        locations += [Location(site.file, line, function_at(site.file, line)) for line in lines]
        suggestion = f"Turn on the script's own torch.compile: {description}"
    else:
        if step_function:
            line = _def_line(site.file, site.function, site.line)
            diff = patches.add_decorator(site.file, line, COMPILE) if line else None
        else:
            wrapper = 'torch.compile({var}, backend="tpu")'
            diff = (
                compile_site.wrap_model_after_construction(site.file, model_class, site.line, wrapper, built)
                if model_class
                else None
            )
        description = f"Wrap {region} in {COMPILE}" + (
            "" if diff else ' (e.g. `model = torch.compile(model, backend="tpu")` after the model is built).'
        )
        suggestion = f"Compile {region} with {COMPILE}: one XLA graph per step, fused and with donated buffers."
    return [
        RULE.finding(
            f"Nothing is compiled: {count:.0f} ops per step run eagerly",
            Evidence("ops per step outside compiled graphs", count, OPS_THRESHOLD, "ops"),
            locations,
            suggestion,
            severity=Severity.info,
            agent_change=AgentChange(description, diff),
            saving_pct=0.0,
            confidence=0.5,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="EM-3",
    name="region to compile",
    category="compile",
    severity=Severity.info,
    rationale='torch.compile(backend="tpu") turns the step into one XLA program; TorchTPU recommends it over eager.',
    before="def train_step(x, y):",
    after='@torch.compile(backend="tpu")\ndef train_step(x, y):',
    references=(
        "docs/tpu-performance.md#eager-modes",
        "https://pytorch.org/docs/stable/torch.compiler.html",
    ),
    requires=(STEPS, HOOKS),
    check=_check,
)
