"""Resizing a tpu tensor's storage (``untyped_storage().resize_()``): FSDP2 frees and re-allocates parameter memory
that way, and torch.compile's fake tensors copy an empty storage's size by resizing theirs. On a device torch
reaches the backend's ``resizePrivateUse1Bytes`` hook, which a Python backend cannot register; the emulation
resizes the data behind the tensor instead.

One fresh process (activation is process-wide) runs the script's body in each eager mode, switched in-process
through TorchTPU's public ``torch.tpu.eager_mode`` (as ``tpu-agent check`` does), with Dynamo's caches reset
between modes so that each mode's torch.compile traces the empty storages afresh; the refusal of a storage whose
tensor is gone is read in the same process. A process per mode paid torch's and Dynamo's start-up three times
over for a few dozen ops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from runtime_launch_util import run_script

pytestmark = pytest.mark.slow  # runs a fresh torch process

MODES = ("strict", "debug", "defer_and_fuse")
ENUM_NAMES = {"strict": "DEFER_NEVER", "debug": "DEFER_NEVER_AND_LAUNCH_BLOCKING", "defer_and_fuse": "DEFER_AND_FUSE"}

SCRIPT = r"""
import json, sys, warnings
import torch
from tpu_agent.runtime.emulated import activate
from tpu_agent.runtime.emulated.state import parse_eager_mode

warnings.simplefilter("ignore")
activate()


def each_mode():
    out = {}
    # FSDP2's pattern, eager: free a tensor's memory, re-allocate it, write it again; views share the storage
    x = torch.arange(8.0, device="tpu")
    view = x[2:]
    x.add_(1)  # pending under DeferAndFuse: it runs before the memory goes
    storage = x.untyped_storage()
    out["before"] = [storage.size(), view.untyped_storage().size()]
    storage.resize_(0)
    out["freed"] = [x.untyped_storage().size(), view.untyped_storage().size()]  # reading it now is undefined
    x.untyped_storage().resize_(32)
    x.copy_(torch.arange(8.0, 16.0))
    out["reallocated"] = [x.untyped_storage().size(), x.cpu().tolist(), view.cpu().tolist()]
    torch.ops.inductor.resize_storage_bytes_(x, 0)  # the op FSDP2 uses under torch.compile
    out["op_freed"] = x.untyped_storage().size()
    torch.ops.inductor.resize_storage_bytes_(x, 32)
    x.fill_(2.0)
    out["op_reallocated"] = x.cpu().tolist()

    # torch.compile: a tensor whose storage is empty (a zero-size tensor: Inkling2Loop's growing block_states; a
    # freed parameter) becomes a fake tensor whose storage is resized to 0
    cat = torch.compile(lambda a, b: torch.cat([a, b], 1) * 2, backend="tpu")
    out["compiled_cat"] = cat(torch.empty(2, 0, 3, device="tpu"), torch.ones(2, 1, 3, device="tpu")).cpu().tolist()
    freed = torch.ones(4, device="tpu")
    freed.untyped_storage().resize_(0)
    scale = torch.compile(lambda unused, y: y * 3, backend="tpu")
    out["compiled_freed_input"] = scale(freed, torch.ones(2, device="tpu")).cpu().tolist()
    out["mode"] = torch.tpu.eager_mode.name
    return out


runs = {}
for mode in sys.argv[1:]:
    torch._dynamo.reset()  # each mode's compiled functions are traced in that mode, not recalled from the last
    torch.tpu.eager_mode = torch.tpu.EagerMode[parse_eager_mode(mode).name]
    runs[mode] = each_mode()

# a storage whose tensor is gone: nothing to resize the data of
torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_NEVER
storage = torch.ones(4, device="tpu").untyped_storage()
try:
    storage.resize_(0)
    runs["gone"] = ""
except RuntimeError as error:
    runs["gone"] = str(error)
print(json.dumps(runs))
"""


@pytest.fixture(scope="module")
def runs(run_once: Callable[..., Any]) -> dict[str, Any]:
    """The script's run, once per session (run_once), also when pytest-xdist splits this module."""
    return run_once("storage-resize", lambda directory: run_script(SCRIPT, directory, *MODES))


@pytest.mark.parametrize("mode", MODES)
def test_freeing_and_reallocating_storage_works_as_on_a_device(runs: dict[str, Any], mode: str) -> None:
    out = runs[mode]
    assert out["mode"] == ENUM_NAMES[mode]  # the body ran in the mode switched to
    assert out["before"] == [32, 32]
    assert out["freed"] == [0, 0]  # the view's memory went too
    assert out["reallocated"] == [32, [float(v) for v in range(8, 16)], [float(v) for v in range(10, 16)]]
    assert out["op_freed"] == 0
    assert out["op_reallocated"] == [2.0] * 8


@pytest.mark.parametrize("mode", MODES)
def test_compiled_functions_take_tensors_with_empty_storage(runs: dict[str, Any], mode: str) -> None:
    out = runs[mode]
    assert out["compiled_cat"] == [[[2.0, 2.0, 2.0]], [[2.0, 2.0, 2.0]]]
    assert out["compiled_freed_input"] == [3.0, 3.0]


def test_a_storage_whose_tensor_is_gone_is_refused_by_name(runs: dict[str, Any]) -> None:
    message = runs["gone"]
    assert "UntypedStorage.resize_ on the 'tpu' device" in message
    assert "tensor.untyped_storage()" in message
