"""Device surface of the emulated tpu: prints one JSON object of observations (run in a fresh process)."""

import io
import json
import sys
import warnings

import torch
from torch.optim.optimizer import _default_to_fused_or_foreach

from tpu_agent.runtime.emulated import activate

chip = sys.argv[1] if len(sys.argv) > 1 else "v6e"
activate(chip=chip)
activate(chip=chip)  # idempotent
warnings.simplefilter("ignore")
out: dict = {}


def error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test compares type and text
        return {"type": type(e).__name__, "message": str(e)}
    return None


out["accelerator"] = {
    "type": str(torch.accelerator.current_accelerator()),
    "available": torch.accelerator.is_available(),
    "device_count": torch.accelerator.device_count(),
    "current_index": torch.accelerator.current_device_index(),
}
out["name"] = torch.tpu.get_device_name()
props = torch.tpu.get_device_properties()
out["props"] = {"name": props.name, "total_memory": props.total_memory}
out["legacy"] = error_of(torch.tpu.is_available)
out["set_device"] = error_of(lambda: torch.accelerator.set_device_index(1))
x = torch.arange(12, dtype=torch.float32).to("tpu").view(3, 4)
out["is_tpu"] = {"is_tpu": x.is_tpu, "device": str(x.device), "tpu_method_moves": type(torch.randn(2).tpu()).__name__ != "Tensor"}
view = x[1]
view.mul_(10)
out["alias"] = x.cpu()[1].tolist()
out["mixed"] = error_of(lambda: x + torch.ones(3, 4))
out["numpy"] = error_of(lambda: x.numpy())
out["repr"] = repr(torch.tensor([1.5, 2.0]).to("tpu"))
out["factories"] = {
    "arange": torch.arange(5, device="tpu").tolist(),
    "eye_rows": torch.eye(2, device="tpu").shape[0],
    "zeros_device": torch.zeros(2, device="tpu").device.type,
}
before = torch.accelerator.memory_allocated()
big = torch.empty(1024, 1024, device="tpu")
out["memory_delta"] = torch.accelerator.memory_allocated() - before
del big
out["memory_freed"] = torch.accelerator.memory_allocated() - before
out["peak_at_least"] = torch.accelerator.max_memory_allocated() >= 4 * 1024 * 1024
model = torch.nn.Linear(3, 2).to("tpu")
buffer = io.BytesIO()
torch.save({"model": model.state_dict(), "step": 3}, buffer)
with open(sys.argv[2], "wb") as handle:
    handle.write(buffer.getvalue())
buffer.seek(0)
loaded = torch.load(buffer)
out["load_default"] = {
    "device": str(loaded["model"]["weight"].device),
    "equal": torch.equal(loaded["model"]["weight"].cpu(), model.weight.detach().cpu()),
}
buffer.seek(0)
out["load_map_tpu"] = str(torch.load(buffer, map_location="tpu")["model"]["bias"].device)
cpu_buffer = io.BytesIO()
torch.save({"w": torch.ones(2)}, cpu_buffer)
cpu_buffer.seek(0)
out["load_cpu_ckpt_to_tpu"] = str(torch.load(cpu_buffer, map_location="tpu")["w"].device)
out["matmul_precision"] = torch.get_float32_matmul_precision()
out["bad_precision"] = error_of(lambda: torch.set_float32_matmul_precision("tf32"))
out["stream"] = error_of(lambda: torch.tpu.Stream().query())
out["amp_dtypes"] = len(torch.tpu.get_amp_supported_dtype())
out["eager_mode"] = torch.tpu.eager_mode.name
# TorchTPU's precision API: out_dtype widens a bf16 product's result; the excess-precision switch under both names
a16, b16 = torch.randn(2, 3, 4).to(torch.bfloat16), torch.randn(2, 4, 5).to(torch.bfloat16)
wide = torch.bmm(a16.to("tpu"), b16.to("tpu"), out_dtype=torch.float32)
out["bmm_out_dtype"] = [str(wide.dtype), torch.equal(wide.cpu(), torch.bmm(a16.float(), b16.float()))]
out["mm_out_dtype"] = str(torch.mm(a16[0].to("tpu"), b16[0].to("tpu"), out_dtype=torch.float32).dtype)
excess = [torch.backends.tpu.allow_excess_precision]
torch.backends.tpu.allow_excess_precision = True
excess.append(torch.tpu.allow_excess_precision)
torch.tpu.allow_excess_precision = False
out["excess_precision"] = [*excess, torch.backends.tpu.allow_excess_precision]
out["unsupported"] = error_of(lambda: torch.linalg.eig(torch.randn(3, 3).to("tpu")))
out["antialias"] = error_of(
    lambda: torch.nn.functional.interpolate(torch.ones(1, 1, 8, 8).to("tpu"), size=(4, 4), mode="bilinear", antialias=True)
)
out["complex32"] = error_of(lambda: x.to(torch.complex32))
grown = torch.randn(3).to("tpu")
grown.unsqueeze_(0)
flipped = torch.randn(2, 3).to("tpu").t_()
out["inplace_meta"] = {
    "unsqueezed_shape": list(grown.shape),
    "unsqueezed_data_shape": list(grown.cpu().shape),
    "transposed_shape": list(flipped.shape),
    "transposed_stride": list(flipped.stride()),
}
with torch.device("tpu"):
    built = torch.nn.Linear(2, 2)
out["device_context"] = str(built.weight.device)
q = torch.randn(2, 4, 16, 8)
attention = torch.nn.functional.scaled_dot_product_attention
rounded = q.to(torch.bfloat16).float()
out["sdpa_bf16_inputs"] = torch.equal(attention(q.to("tpu"), q.to("tpu"), q.to("tpu"), is_causal=True).cpu(), attention(rounded, rounded, rounded, is_causal=True))
# AdamW defaults to its foreach path on the device, as on TorchTPU; a foreach write advances version counters,
# so autograd still catches a saved tensor modified in place
weights = [torch.nn.Parameter(torch.ones(2).to("tpu"))]
saved = weights[0] * 1
product = saved * saved  # saves `saved` for backward
version_before = saved._version
with torch.no_grad():
    torch._foreach_add_([saved], [torch.ones(2).to("tpu")])
out["foreach"] = {
    "adamw_path": "foreach" if _default_to_fused_or_foreach(weights, False)[1] else "per-parameter",
    "version_advanced": saved._version > version_before,
    "autograd_sees_write": error_of(lambda: product.sum().backward()),
}
# output dtypes under torch.autocast("tpu") (TorchTPU's AutocastPrivateUse1 policy)
x = torch.randn(4, 8, device="tpu")
layer = torch.nn.Linear(8, 8).to("tpu")
with torch.autocast("tpu"):
    y = layer(x)
    mm = x @ x.t()
    loss = torch.nn.functional.mse_loss(y, torch.zeros_like(y))
    relu = torch.relu(x)
    default = torch.get_autocast_dtype("tpu")
    y.float().sum().backward()
autocast = {"linear": y.dtype, "mm": mm.dtype, "loss": loss.dtype, "relu": relu.dtype, "default": default, "grad": layer.weight.grad.dtype}
out["autocast"] = {k: str(v) for k, v in autocast.items()}
print(json.dumps(out))
