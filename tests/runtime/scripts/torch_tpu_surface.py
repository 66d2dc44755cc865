"""Code written for TorchTPU, run by tests/runtime/test_torch_tpu_surface.py under `tpu-agent run --chip v6e-4`."""
import json
import os
import subprocess
import sys
import warnings

warnings.simplefilter("ignore")

import torch_tpu  # before torch, as TorchTPU's guides do

import torch
from torch_tpu import api
from torch_tpu._internal import execution_mode as em
from torch_tpu._internal import profiler, sync
from torch_tpu._internal.utils import utils

torch_tpu._loader.load()  # what Ray Train's TPU device manager calls: idempotent
out = {"torch_tpu_file": torch_tpu.__file__, "device": str(api.tpu_device())}

# eager modes: the module property and torch.tpu's are one setting, and each mode behaves as its name says
em.eager_mode = em.EagerMode.DEFER_AND_FUSE
pending = torch.ones(4, device="tpu") * 3
out["fused"] = [str(torch.tpu.eager_mode), sync.is_materialized(pending)]
sync.synchronize([pending], wait=True)
out["after_synchronize"] = sync.is_materialized(pending)
with em.set_eager_mode(em.EagerMode.DEFER_NEVER):
    out["scoped"] = [str(em.eager_mode), sync.is_materialized(torch.ones(2, device="tpu") + 1)]
out["restored"] = str(em.eager_mode)
with em.set_eager_mode(em.EagerMode.DEFER_AND_FUSE):  # the pending graph as StableHLO: one module, both ops
    mlir = sync.computation_mlir((torch.ones(2, 2, device="tpu") + 1) * 2)
    out["mlir_fused"] = ["stablehlo.add" in mlir, "stablehlo.multiply" in mlir]
with em.set_eager_mode(em.EagerMode.DEFER_NEVER):  # Strict: nothing is left pending
    mlir = sync.computation_mlir((torch.ones(2, 2, device="tpu") + 1) * 2)
out["mlir_strict"] = ["stablehlo.add" in mlir, "stablehlo.multiply" in mlir, mlir.startswith("module @")]
with em.set_eager_mode(em.EagerMode.DEFER_AND_FUSE):  # the guides' model.to(device).to(torch.bfloat16), fused
    converted = torch.nn.Linear(4, 2).to("tpu").to(torch.bfloat16)
    out["module_to_bf16_fused"] = str(converted(torch.ones(1, 4, device="tpu", dtype=torch.bfloat16)).cpu().dtype)
em.eager_mode = em.EagerMode.INTERNAL_DEFER_ALL
out["defer_all"] = sync.is_materialized(torch.ones(2, device="tpu") + 1)
em.eager_mode = em.EagerMode.DEFER_NEVER
# the guide's call form is the scoped switch too; reading the property still gives the enum member itself
with em.eager_mode(em.EagerMode.DEFER_AND_FUSE):
    out["called"] = [str(em.eager_mode), sync.is_materialized(torch.ones(2, device="tpu") + 1)]
    try:
        with em.eager_mode("strict"):  # names are accepted where the enum is, as by set_eager_mode
            raise KeyError("inner")
    except KeyError:
        out["called_inner_restored"] = str(em.eager_mode)  # restored on the way out of a raising block
out["called_restored"] = [str(em.eager_mode), em.eager_mode is em.EagerMode.DEFER_NEVER]

# OpTracer: the ATen ops the device was asked for, and a CPU fallback with its line
model = torch.nn.Linear(8, 4).to("tpu")
torch.tpu.enable_cpu_fallback = True
with utils.OpTracer() as tracer:
    model(torch.randn(2, 8, device="tpu")).cpu()
    torch.linalg.eig(torch.randn(3, 3, device="tpu"))  # FALLBACK LINE
out["traced"] = dict(tracer.ops_log["aten"])
out["num_atens"] = tracer.num_atens()
out["fallbacks"] = [[op, site] for (op, site) in tracer.fallbacks]
out["fallback_line"] = next(i for i, line in enumerate(open(__file__), 1) if "# FALLBACK" + " LINE" in line)
out["pformat"] = tracer._pformat()

# assert_close: a mismatch reports counts and tolerance suggestions; the suggested atol passes
expected = torch.tensor([1.0, 2.0, 3.0, 0.0])
actual = expected + torch.tensor([0.0, 0.0, 0.3, 0.0])
try:
    utils.assert_close(actual, expected, rtol=1e-3, atol=1e-3)
except AssertionError as error:
    out["mismatch"] = str(error)
utils.assert_close(actual, expected, rtol=1e-3, atol=0.3 * 1.2)
utils.assert_close(actual.to("tpu").cpu(), expected, check_value=utils.CheckValueMode.SKIP)

# the legacy profiler writes an XProf session the project's diagnose reads
with profiler.profile(
    activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.TPU],
    on_trace_ready=profiler.xprof_trace_handler(dir_name=sys.argv[1]),
):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(2, 8, device="tpu")).sum().backward()
        optimizer.step()
        sync.synchronize(model.weight)

# the device in processes the script starts itself, one chip per process among several
out["lone_device_count"] = torch.accelerator.device_count()
child = "import torch; print(torch.ones(1, device='tpu').device, torch.accelerator.device_count())"
out["python_child"] = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip()
worker = os.path.join(os.path.dirname(sys.argv[1]), "worker.py")
with open(worker, "w") as handle:
    # one write per line: ranks share the pipe, and under PYTHONUNBUFFERED print's pieces interleave
    handle.write("import os, torch\nprint(f\"worker {os.environ['LOCAL_RANK']} {torch.accelerator.device_count()} "
                 "{torch.ones(1, device='tpu').device}\\n\", end='', flush=True)\n")
ranks = subprocess.run(
    [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", sys.argv[2], worker],
    capture_output=True, text=True,
)
out["torchrun_workers"] = sorted(line for line in ranks.stdout.splitlines() if line.startswith("worker"))
out["torchrun_stderr"] = ranks.stderr[-2000:] if ranks.returncode else ""
print(json.dumps(out))
