"""The emulated ``tpu`` device's own random-number generator, in fresh processes (activation is process-wide).

Random ops on tpu tensors draw from the device's default generator, as on CUDA and TorchTPU: a device draw
leaves the program's CPU stream (its data order) alone, ``torch.manual_seed`` seeds both, ``torch.tpu.*`` seeds
and saves the device's only, and ``torch.utils.checkpoint`` replays a block's dropout exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from runtime_launch_util import run_script as run

from tpu_agent.runtime.xla import settings

pytestmark = pytest.mark.slow  # every test runs a fresh torch process

MODES = ("strict", "debug", "defer_and_fuse")

SCRIPT = r"""
import io, json, sys, warnings
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from tpu_agent.runtime.emulated import activate

warnings.simplefilter("ignore")  # torch.tpu's experimental-API notices
torch.manual_seed(21)  # before activation, as before CUDA's lazy initialisation: it seeds the device too
activate(eager_mode=sys.argv[1])
out = {"seeded_before_activation": torch.rand(3, device="tpu").cpu().tolist()}

# the QA finding: device dropout moved the CPU stream (data order) away from a CUDA run's
torch.manual_seed(0)
dropped = F.dropout(torch.ones(8, device="tpu"), 0.5).cpu()
out["cpu_after_dropout"] = torch.rand(3).tolist()


def draws():
    x = torch.ones(16, device="tpu")
    values = [
        F.dropout(x, 0.5), torch.rand(3, device="tpu"), torch.randn(3, device="tpu"),
        torch.randint(9, (3,), device="tpu"), torch.randperm(6, device="tpu"), torch.empty(4, device="tpu").normal_(),
        torch.empty(4, device="tpu").uniform_(), torch.bernoulli(x * 0.5), torch.multinomial(x, 3),
        torch.empty(4, device="tpu").exponential_(), torch.rand_like(x), torch.poisson(x), F.rrelu(-x, training=True),
    ]
    return [v.cpu().tolist() for v in values]


torch.manual_seed(1)
cpu_state = torch.get_rng_state()
out["draws"] = draws()
out["cpu_state_kept"] = bool(torch.equal(cpu_state, torch.get_rng_state()))
torch.manual_seed(1)
out["draws_again"] = draws()
torch.tpu.manual_seed(1)
out["draws_tpu_seeded"] = draws()
torch.manual_seed(2)
out["draws_other_seed"] = draws()
torch.tpu.manual_seed(21)
out["seeded_after_activation"] = torch.rand(3, device="tpu").cpu().tolist()

# a CUDA generator's state: (seed, offset), 16 bytes, the offset moved past each op's numbers in steps of four;
# DTensor writes offsets into it to give each shard of a random tensor its own numbers (FSDP2's meta init)
torch.tpu.manual_seed(7)
start = torch.tpu.get_rng_state_all()[0]
drawn = torch.rand(5, device="tpu").cpu()
after = torch.tpu.get_rng_state_all()[0]
out["philox_state"] = [start.numel(), start[:8].view(torch.int64).item(), start[8:].view(torch.int64).item(),
                       after[8:].view(torch.int64).item()]
shard = start.clone()
shard[8:] = torch.tensor([8], dtype=torch.int64).view(torch.uint8)
torch.tpu.set_rng_state(shard)
at_offset = torch.rand(5, device="tpu").cpu()
torch.tpu.set_rng_state(start)
out["state_replays"] = [bool(torch.equal(drawn, torch.rand(5, device="tpu").cpu())),
                        bool(torch.equal(at_offset, torch.rand(5, device="tpu").cpu()))]
try:
    torch.tpu.set_rng_state(torch.get_rng_state())
    out["cpu_state_refused"] = ""
except ValueError as error:
    out["cpu_state_refused"] = str(error)

# torch.tpu.manual_seed leaves the CPU stream alone
torch.manual_seed(5)
first = torch.rand(2)
torch.manual_seed(5)
torch.tpu.manual_seed(9)
out["cpu_kept_by_tpu_seed"] = bool(torch.equal(first, torch.rand(2)))

# an explicit generator is honoured, tpu or cpu, and the device stream does not move
torch.tpu.manual_seed(11)
expected = torch.rand(4, device="tpu").cpu()
torch.tpu.manual_seed(11)
explicit_tpu = torch.rand(4, device="tpu", generator=torch.Generator("tpu").manual_seed(3)).cpu()
explicit_cpu = torch.poisson(torch.full((4,), 3.0, device="tpu"), generator=torch.Generator().manual_seed(3)).cpu()
torch.tpu.manual_seed(3)
out["explicit_tpu"] = bool(torch.equal(explicit_tpu, torch.rand(4, device="tpu").cpu()))  # as CUDA's: same state
torch.tpu.manual_seed(11)
out["explicit_cpu"] = bool(
    torch.equal(explicit_cpu, torch.poisson(torch.full((4,), 3.0), generator=torch.Generator().manual_seed(3)))
)
out["device_stream_kept_by_explicit"] = bool(torch.equal(expected, torch.rand(4, device="tpu").cpu()))

# a generator the program makes is a device generator: the default's state format, its own stream
user = torch.Generator("tpu")
out["user_generator"] = [str(user.device), user.get_state().numel(), user.initial_seed(), user.get_offset()]
user.manual_seed(5)
torch.tpu.manual_seed(6)
device_start, cpu_start, user_start = torch.tpu.get_rng_state_all()[0], torch.get_rng_state(), user.get_state()
x = torch.ones(16, device="tpu")
user_draws = [  # pending under DeferAndFuse until get_state below, which runs them first
    torch.rand(5, device="tpu", generator=user), torch.randn(3, device="tpu", generator=user),
    torch.empty(4, device="tpu").normal_(generator=user), torch.bernoulli(x * 0.5, generator=user),
    torch.poisson(x, generator=user), torch.multinomial(x, 3, generator=user),
    torch.randperm(6, device="tpu", generator=user), torch.rand(4, device="tpu", generator=torch.Generator("tpu")),
]
user_after = user.get_state()
out["user_streams_apart"] = [
    bool(torch.equal(device_start, torch.tpu.get_rng_state_all()[0])),
    bool(torch.equal(cpu_start, torch.get_rng_state())),
    user_after[:8].view(torch.int64).item(), user_after[8:].view(torch.int64).item(),
]
user_draws = [t.cpu() for t in user_draws]
user.set_state(user_start)
out["user_replays"] = bool(torch.equal(user_draws[0], torch.rand(5, device="tpu", generator=user).cpu()))
torch.tpu.manual_seed(5)
out["user_is_default_layout"] = bool(torch.equal(user_draws[0], torch.rand(5, device="tpu").cpu()))
clone = user.clone_state()
out["user_clone"] = [type(clone) is type(user), bool(torch.equal(clone.get_state(), user.get_state()))]
try:
    user.set_state(torch.get_rng_state())
    out["user_cpu_state_refused"] = ""
except ValueError as error:
    out["user_cpu_state_refused"] = str(error)
saved_state, saved_generator = io.BytesIO(), io.BytesIO()
torch.save(user.get_state(), saved_state)  # a checkpoint's RNG entry: a plain uint8 tensor
torch.save(user, saved_generator)
saved_state.seek(0)
saved_generator.seek(0)
restored = torch.load(saved_generator, weights_only=False)
out["user_pickles"] = [
    bool(torch.equal(torch.load(saved_state, weights_only=True), user.get_state())),
    str(restored.device), bool(torch.equal(restored.get_state(), user.get_state())),
]

# fork_rng, the state API and default_generators
torch.tpu.manual_seed(13)
with torch.random.fork_rng(device_type="tpu"):
    torch.rand(4, device="tpu").cpu()
forked = torch.rand(4, device="tpu").cpu()
torch.tpu.manual_seed(13)
out["fork_rng_restores"] = bool(torch.equal(forked, torch.rand(4, device="tpu").cpu()))
states = torch.tpu.get_rng_state_all()
pending = torch.rand(4, device="tpu")  # under DeferAndFuse drawn when it runs: before the state is restored
torch.tpu.set_rng_state_all(states)
out["state_roundtrip"] = bool(torch.equal(pending.cpu(), torch.rand(4, device="tpu").cpu()))
torch.tpu.set_rng_state(states[0])
out["set_rng_state"] = bool(torch.equal(pending.cpu(), torch.rand(4, device="tpu").cpu()))
generator = torch.tpu.default_generators[0]
out["default_generator"] = [str(generator.device), generator is not torch.default_generator]
torch.tpu.seed()
out["seed_moves"] = generator.initial_seed() != 13

# checkpointed dropout replays the forward's mask: the gradients of the plain block
torch.manual_seed(0)
linear = torch.nn.Linear(16, 16).to("tpu")
inputs = torch.randn(4, 16).to("tpu")


def block(t):
    return F.dropout(linear(t).relu(), 0.5, training=True)


gradients = {}
for name, reentrant in (("plain", None), ("reentrant", True), ("non_reentrant", False)):
    linear.zero_grad()
    x = inputs.detach().requires_grad_()
    torch.manual_seed(3)
    y = block(x) if reentrant is None else checkpoint(block, x, use_reentrant=reentrant)
    (y * torch.arange(16.0, device="tpu")).sum().backward()
    gradients[name] = [x.grad.cpu().tolist(), linear.weight.grad.cpu().tolist()]
out["checkpoint"] = gradients
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs(run_once: Callable[..., Any]) -> dict[str, dict]:
    """The script's run in each mode, once per session (run_once), also when pytest-xdist splits this module."""

    def each_mode(directory: Path) -> dict[str, dict]:
        return {mode: run(SCRIPT, directory, mode) for mode in MODES}

    return run_once("device-rng", each_mode)


@pytest.mark.parametrize("mode", MODES)
def test_device_draws_leave_the_cpu_stream_where_cuda_leaves_it(runs: dict[str, dict], mode: str) -> None:
    out = runs[mode]
    torch.manual_seed(0)
    assert out["cpu_after_dropout"] == torch.rand(3).tolist()
    assert out["cpu_state_kept"]
    assert out["cpu_kept_by_tpu_seed"]


@pytest.mark.parametrize("mode", MODES)
def test_the_device_generator_is_seeded_by_both_seeds_and_reproduces(runs: dict[str, dict], mode: str) -> None:
    out = runs[mode]
    assert out["draws"] == out["draws_again"] == out["draws_tpu_seeded"]
    assert all(a != b for a, b in zip(out["draws"], out["draws_other_seed"], strict=True))
    assert out["seeded_before_activation"] == out["seeded_after_activation"]


@pytest.mark.parametrize("mode", MODES)
def test_the_device_state_is_a_seed_and_offset_that_replays(runs: dict[str, dict], mode: str) -> None:
    out = runs[mode]
    assert out["philox_state"] == [16, 7, 0, 8]  # rand(5) moved the offset by 5, rounded up to Philox's 4s
    assert out["state_replays"] == [True, True]
    assert "16 bytes (seed, offset), got 5056" in out["cpu_state_refused"]


def test_every_eager_mode_draws_the_same_numbers(runs: dict[str, dict]) -> None:
    assert runs["strict"]["draws"] == runs["debug"]["draws"] == runs["defer_and_fuse"]["draws"]


@pytest.mark.parametrize("mode", MODES)
def test_explicit_generators_state_api_and_fork_rng(runs: dict[str, dict], mode: str) -> None:
    out = runs[mode]
    assert out["explicit_tpu"] and out["explicit_cpu"] and out["device_stream_kept_by_explicit"]
    assert out["fork_rng_restores"] and out["state_roundtrip"] and out["set_rng_state"]
    assert out["default_generator"] == ["tpu:0", True]
    assert out["seed_moves"]


@pytest.mark.parametrize("mode", MODES)
def test_a_generator_the_program_makes_is_a_device_generator(runs: dict[str, dict], mode: str) -> None:
    out = runs[mode]
    assert out["user_generator"] == ["tpu:0", 16, 67280421310721, 0]  # a new CUDA generator's seed and offset
    # its draws move neither the default generator nor the CPU stream; its own offset moved past 5+3+4+16+16+3+6
    # numbers in Philox's steps of four (a throwaway generator's draw moved nothing of it)
    assert out["user_streams_apart"] == [True, True, 5, 8 + 4 + 4 + 16 + 16 + 4 + 8]
    assert out["user_replays"] and out["user_is_default_layout"]
    assert out["user_clone"] == [True, True]
    assert "16 bytes (seed, offset), got 5056" in out["user_cpu_state_refused"]
    assert out["user_pickles"] == [True, "tpu:0", True]


@pytest.mark.parametrize("mode", MODES)
def test_checkpointed_dropout_gives_the_gradients_of_the_plain_block(runs: dict[str, dict], mode: str) -> None:
    gradients = runs[mode]["checkpoint"]
    assert gradients["reentrant"] == gradients["plain"]
    assert gradients["non_reentrant"] == gradients["plain"]


XLA_SCRIPT = r"""
import json, warnings
import torch
import torch.nn.functional as F
from tpu_agent.runtime.emulated import activate

warnings.simplefilter("ignore")
activate()
dropped = torch.compile(lambda t: F.dropout(t, 0.5, training=True), backend="tpu")
x = torch.ones(64, device="tpu")
torch.manual_seed(0)
first = dropped(x).cpu()
after = torch.rand(3).tolist()
torch.tpu.manual_seed(0)
again = dropped(x).cpu()
print(json.dumps({"cpu_after": after, "same": bool(torch.equal(first, again)), "rate": float((first == 0).float().mean())}))
"""


def test_compiled_dropout_seeds_from_the_device_generator(tmp_path: Path) -> None:
    if settings.missing_xla_packages():
        pytest.skip(f"the XLA compiler needs {settings.missing_xla_packages()}")
    out = run(XLA_SCRIPT, tmp_path, TPU_AGENT_COMPILER="xla")
    torch.manual_seed(0)
    assert out["cpu_after"] == torch.rand(3).tolist()  # the executable's seed came from the device generator
    assert out["same"] and 0.2 < out["rate"] < 0.8
