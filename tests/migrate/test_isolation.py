"""One rule's error costs one edit, never the file; several rules' edits of one call compose."""

from __future__ import annotations

import ast

import libcst as cst
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tpu_agent.migrate.engine.dispatch import Dispatch
from tpu_agent.migrate.engine.pypass import migrate_source
from tpu_agent.migrate.engine.worker import dispatch
from tpu_agent.migrate.model import MigrateOptions, Safety, Target
from tpu_agent.migrate.rules import ALL_RULES, FAMILIES
from tpu_agent.migrate.rules._base import Family

SOURCE = """import torch

x = torch.ones(2).cuda()
torch.cuda.synchronize()
y = torch.zeros(3, device="cuda")
"""


def _failing_dispatch() -> Dispatch:
    """The real families plus one whose handler raises at the ``synchronize`` call, after reporting under a rule
    and asking for the device resolver: the error must take back both."""
    broken = Family("devices")  # its handlers report under an existing code, as a family module's do
    broken.rules = [ALL_RULES["TPU101"]]

    @broken.leave(cst.Call)
    def explode(ctx, original, updated):  # noqa: ANN001, ANN202
        if isinstance(original.func, cst.Attribute) and original.func.attr.value == "synchronize":
            ctx.fix("TPU202", original, lambda: ctx.device(), lambda n: "half-done edit")
            raise IndexError("list index out of range")
        return updated

    return Dispatch.from_families([*FAMILIES, broken])


def test_an_error_in_one_rule_drops_that_edit_and_migrates_the_rest() -> None:
    outcome = migrate_source(
        SOURCE, MigrateOptions(target=Target.TPU), ALL_RULES, _failing_dispatch(), ast.parse(SOURCE)
    )
    assert outcome.code is not None
    # the other lines are migrated, and so is the failing call by the rule that renamed its function before
    assert 'x = torch.ones(2).to("tpu")' in outcome.code
    assert 'y = torch.zeros(3, device="tpu")' in outcome.code
    assert "\ntorch.accelerator.synchronize()\n" in outcome.code
    errors = [f for f in outcome.findings if "internal error" in f.message]
    assert len(errors) == 1
    error = errors[0]
    assert error.code == "TPU202" and not error.fixed and error.position[0] == 4
    assert "IndexError" in error.message and "please report it" in error.message
    # what the failing handler reported before it raised is gone: no finding claims the dropped edit
    assert not any(f.message == "half-done edit" for f in outcome.findings)


# ---- every known trigger pattern, combined at random on one call ----------------------------------------
CALLEES = [
    "dist.init_process_group",
    "dist.new_group",
    "DDP",
    "dist.barrier",
    "init_device_mesh",
    "model.to",
    "model.cuda",
    "torch.autocast",
    "torch.compile",
    "DataLoader",
    "torch.device",
    "parser.add_argument",
    "torch.cuda.current_stream",
    "torch.load",
    "torch.zeros",
    "torch.cuda.set_device",
    "batch.pin_memory",
]
VALUES = [
    '"nccl"',
    '"cuda"',
    '"cuda:0"',
    '"cuda:nccl,cpu:gloo"',
    '"nccl" if dist.is_nccl_available() else "gloo"',
    '"cuda" if torch.cuda.is_available() else "cpu"',
    'os.environ.get("BACKEND", "nccl")',
    'f"cuda:{local_rank}"',
    'torch.device("cuda", local_rank)',
    "local_rank",
    "[local_rank]",
    "device",
    "model",
    "0",
    "True",
    '"--backend"',
    '"--device"',
    '"max-autotune"',
    "torch.float16",
    "dist.Backend.NCCL",
]
KEYWORDS = [
    "backend",
    "device_id",
    "device_ids",
    "output_device",
    "device",
    "device_type",
    "map_location",
    "pin_memory_device",
    "mode",
    "dynamic",
    "default",
    "dtype",
    "non_blocking",
    "world_size",
]
HEADER = """import os
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

local_rank = int(os.environ["LOCAL_RANK"])
"""


@st.composite
def calls(draw: st.DrawFn) -> str:
    callee = draw(st.sampled_from(CALLEES))
    positional = draw(st.lists(st.sampled_from(VALUES), max_size=3))
    names = draw(st.lists(st.sampled_from(KEYWORDS), max_size=4, unique=True))
    keywords = [f"{name}={draw(st.sampled_from(VALUES))}" for name in names]
    unpacked = ["**options"] if draw(st.booleans()) else []
    return f"{callee}({', '.join([*positional, *keywords, *unpacked])})"


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(call=calls(), target=st.sampled_from(list(Target)), unsafe=st.booleans())
# the speedrun call that raised IndexError in replace_arg_value: TPU401 dropped the backend, TPU407 read index 1
@example(
    call='dist.init_process_group(backend="cuda:nccl,cpu:gloo", device_id=device)',
    target=Target.ACCELERATOR,
    unsafe=False,
)
def test_rules_combined_on_one_call_never_raise(call: str, target: Target, unsafe: bool) -> None:
    source = f"{HEADER}options = {{}}\ndevice = torch.device('cuda', local_rank)\nresult = {call}\n"
    options = MigrateOptions(target=target, unsafe_fixes=unsafe)
    outcome = migrate_source(source, options, ALL_RULES, dispatch(), ast.parse(source))
    assert not [f.message for f in outcome.findings if "internal error" in f.message]
    ast.parse(outcome.code or source)
    for finding in outcome.findings:
        assert finding.safety is ALL_RULES[finding.code].safety or finding.safety is Safety.MANUAL
