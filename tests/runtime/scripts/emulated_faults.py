"""Regression checks for the emulated runtime's fault classes, in each eager mode named on the command line (in
that order, switched in-process after activating the first: torch is imported once for all of them); prints one
JSON object of the observations by mode.

Every comparison is against plain CPU torch at precision "highest", where the emulation promises exact parity.
"""

import json
import sys
import traceback
import warnings

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tpu_agent.runtime.emulated import activate

# A notebook's CPU work before activate(): torch's autograd engine sizes its device queues at this first backward,
# before the tpu device exists; every tpu backward below then runs after a late activate().
cpu_leaf = torch.ones(3, requires_grad=True)
(cpu_leaf * 2).sum().backward()
activate(eager_mode=sys.argv[1])
torch.set_float32_matmul_precision("highest")
warnings.simplefilter("ignore")


def error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects type, text and frames
        frames = [f.filename for f in traceback.extract_tb(e.__traceback__)]
        emulator = [f for f in frames if "tpu_agent" in f]
        return {"type": type(e).__name__, "message": str(e), "emulator_frames": len(emulator)}
    return None


def same(a, b):
    return bool(torch.equal(a.detach().cpu(), b.detach()))


def recurrent_matches(make, x):
    """A recurrent module on the CPU and a copy on tpu: outputs and every parameter's gradient agree (not bit for
    bit: on an accelerator torch adds the biases inside the fused cell, on the CPU in the gate matmuls)."""
    torch.manual_seed(0)
    cpu = make()
    tpu = make().to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    ref, got = cpu(x), tpu(x.to("tpu"))
    ref, got = (ref[0], got[0]) if isinstance(ref, tuple) else (ref, got)
    ref.pow(2).sum().backward()
    got.pow(2).sum().backward()
    pairs = [(got, ref), *((t.grad, c.grad) for c, t in zip(cpu.parameters(), tpu.parameters()))]
    return all(torch.allclose(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6) for a, b in pairs)


def grads_match(fn, *inputs):
    """fn on CPU inputs and on tpu copies: outputs and every input gradient bit-identical."""
    cpu = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    tpu = [t.detach().to("tpu").requires_grad_(t.requires_grad) for t in inputs]
    ref, got = fn(*cpu), fn(*tpu)
    ref.sum().backward()
    got.sum().backward()
    ok = same(got, ref)
    for c, t in zip(cpu, tpu):
        if c.requires_grad:
            ok = ok and t.grad is not None and same(t.grad, c.grad)
    return ok


def rotary(z, freqs):
    return torch.view_as_real(torch.view_as_complex(z) * freqs.to(z.device).conj())


def train_losses(device):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data, target = torch.randn(5, 6).to(device), torch.tensor([0, 2, 1, 1, 0]).to(device)
    losses = []
    for _ in range(4):  # the same op signatures every step: later steps are recorded from the shape cache
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def observe() -> dict:
    """Every observation, in the current eager mode."""
    out: dict = {}
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, requires_grad=True) for _ in range(3))
    k_gqa, v_gqa = (torch.randn(2, 2, 6, 8, requires_grad=True) for _ in range(2))
    bool_mask = torch.rand(2, 1, 6, 6) > 0.3
    bool_mask[..., 0] = True  # no fully masked row
    float_mask = torch.randn(2, 1, 6, 6, requires_grad=True)
    out["attention"] = {
        "plain": grads_match(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v),
        "causal": grads_match(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v),
        "bool_mask": grads_match(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, bool_mask),
        "mask_requires_grad": grads_match(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, float_mask),
        "gqa": grads_match(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), q, k_gqa, v_gqa),
        "gqa_bool_mask": grads_match(
            lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True), q, k_gqa, v_gqa, bool_mask
        ),
    }

    x = torch.randn(4, 5)
    idx = torch.tensor([0, 3])
    out["index_with_list"] = {
        "device_index": same(x.to("tpu")[:, idx.to("tpu")], x[:, idx]),
        "host_index": same(x.to("tpu")[:, idx], x[:, idx]),
        "nested": same(torch.stack([x.to("tpu"), x.to("tpu")])[..., idx.to("tpu")], torch.stack([x, x])[..., idx]),
    }

    c = torch.complex(torch.randn(6), torch.randn(6))
    freqs = torch.polar(torch.ones(6), torch.arange(6.0))
    z = torch.randn(6, 2, requires_grad=True)

    out["math_bits"] = {
        "conj_mul": same(c.to("tpu").conj() * 1, c.conj() * 1),
        "conj_flag": c.to("tpu").conj().is_conj(),
        "neg_view": same(torch._neg_view(x.to("tpu")) * 1, torch._neg_view(x) * 1),
        "complex_rotary_grads": grads_match(lambda z: rotary(z, freqs), z),
        "zero_tensor": same(torch._efficientzerotensor(3, device="tpu"), torch.zeros(3)),
    }
    out["refused"] = {
        "sparse": error_of(lambda: torch.randn(3, 3).to_sparse().to("tpu")),
        "quantized": error_of(lambda: torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8).to("tpu")),
    }

    ints = torch.tensor([0, 1, 1, 3, 2, 3], dtype=torch.int32)
    out["cpu_gaps"] = {
        "histc_int": same(torch.histc(ints.to("tpu"), bins=4, min=0, max=3), torch.histc(ints.double(), bins=4, min=0, max=3).int()),
        "upsample_int": same(
            F.interpolate(ints.view(1, 1, 2, 3).to("tpu"), scale_factor=2), F.interpolate(ints.view(1, 1, 2, 3).double(), scale_factor=2).int()
        ),
    }
    sequence, step = torch.randn(5, 2, 4), torch.randn(2, 4)
    out["cpu_gaps"]["recurrent"] = {
        "lstm": recurrent_matches(lambda: torch.nn.LSTM(4, 6, num_layers=2), sequence),
        "gru": recurrent_matches(lambda: torch.nn.GRU(4, 6, bias=False), sequence),
        "lstm_cell": recurrent_matches(lambda: torch.nn.LSTMCell(4, 6), step),
        "gru_cell": recurrent_matches(lambda: torch.nn.GRUCell(4, 6), step),
    }
    out["cpu_kernel_error"] = error_of(lambda: torch.median(torch.tensor([True, False]).to("tpu")).item())

    a, b = torch.randn(4, 8), torch.randn(2, 8, 16)
    offsets = torch.tensor([2, 4], dtype=torch.int32)
    out["grouped_mm_f32"] = same(torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs=offsets.to("tpu")), torch._grouped_mm(a, b, offs=offsets))

    # CPU's softplus_backward lays its result out like a transposed grad_output, meta like self (olmo_hybrid's
    # backward): reshape decides view-or-copy on the strides it sees, so under DeferAndFuse it records a view that
    # holds for meta's layout, and that view must still hold when the graph runs.
    grad_t, self_c = torch.randn(2, 30, 8).transpose(1, 2), torch.randn(2, 8, 30)
    layout_ref = torch.ops.aten.softplus_backward(grad_t, self_c, 1.0, 20.0).reshape(2, 240)
    layout_got = torch.ops.aten.softplus_backward(grad_t.to("tpu"), self_c.to("tpu"), 1.0, 20.0).reshape(2, 240) * 1
    out["recorded_layout_view"] = same(layout_got, layout_ref)

    generator = torch.Generator("tpu")
    generator.manual_seed(7)
    drawn = torch.randn(5, generator=generator, device="tpu")
    torch.tpu.manual_seed(7)
    out["generator"] = {
        "device": str(generator.device),
        "state_bytes": generator.get_state().numel(),
        "matches_device_seed": same(drawn, torch.randn(5, device="tpu").cpu()),  # a CUDA generator's state, as the default's
        "is_generator": isinstance(generator, torch.Generator) and isinstance(torch.default_generator, torch.Generator),
    }

    grown = torch.arange(3.0).to("tpu")
    alias = grown
    grown.resize_(2, 4)
    grown[1].fill_(5.0)
    out["resize_grow"] = {"shape": list(alias.shape), "kept": grown.view(-1)[:3].tolist(), "row": grown[1].tolist()}
    source = torch.arange(5.0).to("tpu")
    target = torch.zeros(2, device="tpu")
    target.set_(source)  # to a larger source: the tensor takes its size, as set_ does on the CPU
    viewed = torch.zeros(3, device="tpu")
    view = viewed[:2]
    out["grow_in_place"] = {
        "set_larger": [list(target.shape), target.tolist()],
        "with_view_refused": error_of(lambda: viewed.resize_(8)),
        "after_refusal": [list(viewed.shape), viewed.tolist(), view.tolist()],
    }

    # ``out=`` variants resize ``out`` to the result: the tensor must take the result's shape (it kept its old one,
    # and read the wrong elements); a result larger than its memory is refused with what to allocate instead.
    values = torch.arange(6.0).view(2, 3)
    roomy, exact = torch.empty(20, device="tpu"), torch.empty(2, 6, device="tpu")
    returned = torch.cat([values.to("tpu"), values.to("tpu")], dim=1, out=exact)
    sorted_values, sorted_indices = torch.empty(7, device="tpu"), torch.empty(7, dtype=torch.long, device="tpu")
    torch.sort(values.flip(0).to("tpu").view(-1), out=(sorted_values, sorted_indices))
    small = torch.empty(0, device="tpu")
    out["out_arguments"] = {
        "shrunk": same(torch.add(values.to("tpu"), 1, out=roomy), values + 1) and list(roomy.shape) == [2, 3],
        "same_size": returned is exact and same(exact, torch.cat([values, values], dim=1)),
        "tuple": same(sorted_values, values.flip(0).view(-1).sort().values) and same(sorted_indices, values.flip(0).view(-1).sort().indices),
        "grow_refused": error_of(lambda: torch.cat([values.to("tpu")] * 2, out=small)),
        "after_refusal": list(small.shape),
    }

    host = torch.arange(6.0)
    pinned = host.pin_memory()
    loader = DataLoader(TensorDataset(torch.arange(8.0).view(4, 2)), batch_size=2, pin_memory=True)
    batches = [batch for (batch,) in loader]
    loader_device = DataLoader(TensorDataset(torch.arange(8.0).view(4, 2)), batch_size=2, pin_memory=True, pin_memory_device="tpu")
    out["pinned"] = {
        "pin_memory": [host.is_pinned(), pinned.is_pinned(), pinned[2:].is_pinned(), same(pinned, host)],
        "loader": [b.is_pinned() for b in batches] + [next(iter(loader_device))[0].is_pinned()],
        "factories": [
            torch.empty(3, pin_memory=True).is_pinned(),
            torch.zeros(2, 2, pin_memory=True).is_pinned(),
            torch.tensor([1.0, 2.0], pin_memory=True).is_pinned(),
            torch.randn(4, pin_memory=True)[1:].is_pinned(),
            host.new_zeros(3, pin_memory=True).is_pinned(),
            torch.empty(3, pin_memory=False).is_pinned(),
            same(torch.full((2,), 7.0, pin_memory=True).to("tpu"), torch.full((2,), 7.0)),
        ],
        "non_blocking": same(pinned.to("tpu", non_blocking=True), host) and same(host.to("tpu").to("cpu", non_blocking=True), host),
    }

    # ``param.data = other`` (weight tying and re-initialisation in public scripts): the parameter computes with the
    # new data, also when the new value is still deferred and after its old data fed a matmul (MXU rounding cache).
    tied = torch.nn.Linear(3, 2).to("tpu")
    tied(torch.ones(1, 3, device="tpu")).sum().item()
    tied.weight.data = torch.full((2, 3), 0.5, device="tpu") * 2
    out["data_assign"] = {
        "values": same(tied(torch.ones(1, 3, device="tpu")) - tied.bias, torch.full((1, 2), 3.0)),
        "shape_follows": [list(tied.weight.shape), tied.weight.requires_grad],
    }

    from tpu_agent.runtime.emulated import shape_cache  # after activation, like user code

    out["repeated_steps"] = {"match_cpu": train_losses("tpu") == train_losses("cpu"), "cached_signatures": len(shape_cache._cache) > 0}
    out["device_count"] = torch.accelerator.device_count()
    return out


observed = {}
for mode in sys.argv[1:]:
    torch.tpu.eager_mode = mode
    observed[mode] = observe()
print(json.dumps(observed))
