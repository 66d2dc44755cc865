"""The input buffers kept as JAX arrays between flushes (tpu_agent.runtime.xla.arrays): kept while right, remade
when the memory moves, never a reason for memory to outlive its tensors."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tpu_agent.runtime.xla import arrays


def values(t: torch.Tensor) -> np.ndarray:
    return np.asarray(arrays.array(t))


def test_a_storage_keeps_one_buffer_and_array_that_see_every_write() -> None:
    weights = torch.arange(12, dtype=torch.float32)
    view = weights[4:].view(2, 4)
    flat = arrays.buffer(view)
    assert arrays.buffer(weights) is flat  # one buffer per storage, whichever view reads it
    first = arrays.array(flat)
    assert arrays.array(flat) is first  # made once, not per call
    weights.mul_(2)  # in-place writes (an optimizer step) reach the kept array: it aliases the memory
    np.testing.assert_array_equal(values(flat), np.arange(12) * 2)


def test_a_reallocated_storage_gets_a_new_buffer_over_its_new_memory() -> None:
    weights = torch.ones(8)
    old = arrays.buffer(weights)
    arrays.array(old)
    storage = weights.untyped_storage()
    storage.resize_(0)  # FSDP frees a parameter's memory this way between uses
    storage.resize_(64 * 4)
    weights.set_(storage, 0, (64,), (1,)).fill_(3.0)
    new = arrays.buffer(weights)
    assert new is not old
    assert new.numel() == 64
    np.testing.assert_array_equal(values(new), np.full(64, 3.0))


def test_buffers_that_reach_xla_as_copies_are_copied_again_at_each_call() -> None:
    ids = torch.zeros(5, dtype=torch.int64)
    flat = arrays.buffer(ids)
    assert not values(flat).any()
    ids.fill_(1)  # a kept copy would still say zero
    assert values(flat).all()


def test_bool_tensors_reach_xla_as_their_bytes_over_the_same_memory() -> None:
    mask = torch.tensor([True, False, True])
    made = arrays.array(mask)
    assert made.dtype == np.uint8  # the executables take bool inputs as uint8 (lowering._from_wire)
    assert made.unsafe_buffer_pointer() == mask.data_ptr()
    assert arrays.array(mask) is made
    mask.logical_not_()
    np.testing.assert_array_equal(np.asarray(made), [0, 1, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_an_executables_result_comes_back_as_its_own_array(dtype: torch.dtype) -> None:
    """A compiled forward's saved activations are the backward's inputs: no second import of their buffers."""
    produced = jax.jit(lambda x: x > 0)(jnp.arange(-2, 4)).astype(jnp.uint8 if dtype is torch.bool else jnp.float32)
    tensor = arrays.result(produced, dtype)
    assert tensor.dtype is dtype
    assert tensor.data_ptr() == produced.unsafe_buffer_pointer()  # no copy
    assert arrays.array(tensor) is produced
    np.testing.assert_array_equal(tensor.numpy(), [False, False, False, True, True, True])


def test_a_view_of_the_storage_in_another_dtype_gets_a_buffer_of_that_dtype() -> None:
    data = torch.zeros(4, dtype=torch.float32)
    arrays.buffer(data)
    assert arrays.buffer(data.view(torch.int32)).dtype is torch.int32


def test_the_cache_lets_memory_go_once_its_tensors_are_gone() -> None:
    activation = torch.randn(1024)
    arrays.array(arrays.buffer(activation))
    storage = activation.untyped_storage()
    weak = storage._weak_ref()
    del activation, storage
    gc.collect()
    assert not torch.UntypedStorage._expired(weak)  # still held by the cache until the next flush's sweep
    arrays.sweep()
    assert torch.UntypedStorage._expired(weak)
    torch.UntypedStorage._free_weak_ref(weak)


def test_a_tensor_keeps_its_array_while_its_memory_and_layout_stay() -> None:
    weight = torch.arange(6, dtype=torch.float32)  # a parameter's data, passed to every compiled call
    first = arrays.array(weight)
    assert arrays.array(weight) is first
    weight.add_(1)
    np.testing.assert_array_equal(values(weight), np.arange(6) + 1)
    weight.set_(torch.full((6,), 7.0))  # new memory: a new array over it
    np.testing.assert_array_equal(values(weight), np.full(6, 7.0))
    weight.resize_(2, 3)  # same memory, new layout
    assert arrays.array(weight).shape == (2, 3)


def test_an_array_holds_its_tensors_memory_only_while_the_tensor_lives() -> None:
    activation = torch.randn(256)
    arrays.array(activation)
    weak = activation.untyped_storage()._weak_ref()
    del activation  # no sweep needed: the array goes with its tensor
    gc.collect()
    assert torch.UntypedStorage._expired(weak)
    torch.UntypedStorage._free_weak_ref(weak)


@pytest.mark.parametrize(
    "values_64",
    [
        torch.tensor([3, -7, 2**31 - 1, 2**40 + 5]),  # token ids, and values past int32
        torch.tensor([0.1, 1 + 1e-12, -2.5e-40, 1e300], dtype=torch.float64),  # past float32's precision and range
    ],
)
def test_64_bit_tensors_reach_xla_whole(values_64: torch.Tensor) -> None:
    """TorchTPU runs int64 and float64 as XLA's S64 and F64: nothing is narrowed on the way in."""
    converted = arrays.to_jax(values_64)
    assert converted.dtype.itemsize == 8
    np.testing.assert_array_equal(np.asarray(converted), values_64.numpy())


def test_64_bit_arithmetic_in_an_executable_gives_torchs_values() -> None:
    """Values past int32 and float32 and a Python float scalar on a float64 tensor: exactly what torch computes
    (the executables once ran with JAX's 32-bit types, and compiled ``[2**40 + 5] + 1`` gave 6, silently)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tpu_agent.runtime.emulated import state
    from tpu_agent.runtime.xla import graphs

    def arithmetic(ids: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ids * 3 + 2**33, x * 0.1 + 1e-13

    ids, x = torch.tensor([2**40 + 5, 3_000_000_000]), torch.tensor([1 + 1e-12, 3.0], dtype=torch.float64)
    runner = graphs.GraphRunner(make_fx(arithmetic)(ids, x), "64-bit", precision=state.Precision.HIGHEST)
    (got_ids, got_x), (expected_ids, expected_x) = runner(ids, x), arithmetic(ids, x)
    assert got_ids.dtype == torch.int64 and got_ids.tolist() == expected_ids.tolist()
    assert got_x.dtype == torch.float64  # to a double's rounding (XLA may fuse the multiply-add); f32 is off by 1e-8
    torch.testing.assert_close(got_x, expected_x, rtol=1e-15, atol=0)


def test_a_size_one_dimensions_stride_does_not_change_the_layout_xla_sees() -> None:
    """torch calls ``[2, 16, 1]`` with strides ``(16, 1, 16)`` contiguous; JAX read a transposed layout from its
    DLPack strides and the executable (compiled for row-major inputs) refused it: Perceiver's compiled backward."""
    data = torch.arange(32, dtype=torch.float32)
    odd = data.as_strided((2, 16, 1), (16, 1, 16))
    assert odd.is_contiguous()
    compiled = jax.jit(lambda x: x * 2).lower(jax.ShapeDtypeStruct((2, 16, 1), jnp.float32)).compile()
    np.testing.assert_array_equal(np.asarray(compiled(arrays.array(odd))), odd.numpy() * 2)
    assert arrays.array(odd).unsafe_buffer_pointer() == odd.data_ptr()  # still the tensor's memory, not a copy
