"""ATen FX graphs lowered to JAX functions through torchax's op table, compiled ahead of time by XLA.

A graph (an AOTAutograd forward or backward graph, or a functionalised DeferAndFuse graph) is interpreted once
with torchax tensors wrapping JAX tracers, inside ``jax.jit``'s trace: every ATen op becomes the JAX code of
torchax's lowering, and XLA compiles the whole function into one executable. Three things differ from plain
torchax, all so that the result matches the emulated device's eager numerics:

* **MXU precision.** The operands of matmul-family ops (:data:`ops.MXU_OPERANDS`) are rounded as the eager
  emulation rounds them (1-pass bf16 at DEFAULT, ~16 significand bits at HIGH, untouched at HIGHEST); the
  precision is part of the executable's cache key.
* **RNG.** The PRNG key is made from a seed argument of the executable, drawn from the device's generator at each
  call, so dropout is fresh every step, and reproducible under ``torch.manual_seed``.
* **Input mutation.** An op that writes into a graph input (``copy_`` into a placeholder, as functionalisation
  leaves them, or any in-place op torchax implements by rebinding its tensor) makes the new value an extra
  output; the caller writes it back into the input's CPU data.

Ops torchax has no lowering for are found before tracing (:func:`unsupported_ops`); the callers split the
graph around them (see :mod:`tpu_agent.runtime.xla.partition`).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as pytree
from jax._src.lax.lax import _convert_element_type  # the one way to make a weakly typed value from an array

from tpu_agent.runtime.emulated import generator, ops, state
from tpu_agent.runtime.xla import arrays, extra_ops, torchax_compat

# Ops that are pure Python over ints/tuples or graph plumbing: never need a lowering.
_PLUMBING = frozenset({operator.getitem, operator.add, operator.mul, operator.sub, operator.floordiv, operator.neg})


class _TraceState(threading.local):
    precision: state.Precision = state.Precision.HIGHEST


_trace = _TraceState()


def round_mantissa(x: jax.Array, bits: int) -> jax.Array:
    """``x`` (f32) rounded to nearest even at ``bits`` significand bits: the JAX twin of the eager rounding."""
    drop = 23 - bits
    i = jax.lax.bitcast_convert_type(x, jnp.int32)
    i = i + ((i >> drop) & 1) + ((1 << (drop - 1)) - 1)
    i = i & jnp.int32(-(1 << drop))
    return jax.lax.bitcast_convert_type(i, jnp.float32)


def mxu_round(x: Any, precision: state.Precision) -> Any:
    """An MXU operand as TorchTPU sees it (see ``mxu.mxu_operand`` for the eager version)."""
    if not isinstance(x, jax.Array) or precision is state.Precision.HIGHEST:
        return x
    if x.dtype == jnp.float32:
        if precision is state.Precision.DEFAULT:
            return x.astype(jnp.bfloat16).astype(jnp.float32)
        return round_mantissa(x, 16)
    if x.dtype == jnp.float16 and precision is state.Precision.DEFAULT:
        return x.astype(jnp.bfloat16).astype(jnp.float16)
    return x


def _round_mxu_operands(table: dict[Any, Any], key: Any, positions: tuple[int, ...]) -> None:
    """Replace torchax's lowering of an MXU op by one that rounds its matmul operands at the trace's precision."""
    operator_entry = table[key]
    inner = operator_entry.func
    is_jax = operator_entry.is_jax_function

    def rounded(*args: Any, **kwargs: Any) -> Any:
        precision = _trace.precision
        if precision is state.Precision.HIGHEST:
            return inner(*args, **kwargs)
        values = list(args)
        for p in positions:
            if p < len(values):
                values[p] = mxu_round(values[p], precision) if is_jax else _round_torchax(values[p], precision)
        return inner(*values, **kwargs)

    extra_ops.set_lowering(
        table,
        key,
        rounded,
        torch_op=operator_entry.torch_op,
        is_jax_function=is_jax,
        is_user_defined=operator_entry.is_user_defined,
        needs_env=operator_entry.needs_env,
        is_view_op=operator_entry.is_view_op,
    )


def _round_torchax(t: Any, precision: state.Precision) -> Any:
    if hasattr(t, "apply_jax"):
        return t.apply_jax(mxu_round, precision)
    return t


_env: Any = None
_env_lock = threading.Lock()


def environment() -> Any:
    """The torchax environment the lowering uses (built once: loading the op table takes seconds)."""
    global _env
    with _env_lock:
        if _env is None:
            torchax = torchax_compat.load()
            env = torchax.tensor.Environment()
            env._should_use_torchax_tensor = lambda device: True  # factories in a graph make traced arrays
            extra_ops.install(env)
            for op, positions in ops.MXU_OPERANDS.items():
                for table in (env._ops, env._decomps):
                    for key in (op, op.overloadpacket):
                        if key in table:
                            _round_mxu_operands(table, key, positions)
            _env = env
        return _env


# Collectives stay outside the executables: the emulated device runs them through tpu_dist, between compiled
# pieces of the graph (torchax would lower them to JAX collectives over a device mesh this process lacks).
_COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional", "c10d", "_dtensor"})


# Ops whose output shape or a host value depends on the data (masked_select, nonzero, unique, item): an XLA
# program has static shapes, so they run on the CPU path and the pieces after them compile for the shapes
# they actually produced (Dynamo graphs with capture_dynamic_output_shape_ops contain them).
_DATA_DEPENDENT_TAGS = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)


def has_lowering(target: Any) -> bool:
    """Whether a node's target can be traced to JAX (an ATen op torchax lowers, or Python plumbing)."""
    if target in _PLUMBING or not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    if target.namespace in _COLLECTIVE_NAMESPACES:
        return False
    env = environment()
    try:
        env._get_op_or_decomp(target)
    except Exception:  # noqa: BLE001 - torchax's OperatorNotFound, or any failure to resolve: no lowering
        return False
    return True


def is_data_dependent(node: torch.fx.Node) -> bool:
    """Whether the op's output shape depends on its input values here. The tags say whether it *can*
    (``aten.index.Tensor`` has one for boolean masks); the traced output says whether it did: an unknown size
    (an unbacked symbol) or no recorded shape at all. Integer indexing, as every GPT-2 and BERT forward has,
    has a static shape and is lowered."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or not any(tag in target.tags for tag in _DATA_DEPENDENT_TAGS):
        return False
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else [value]
    return not values or not all(
        isinstance(v, torch.Tensor) and all(isinstance(size, int) for size in v.shape) for v in values
    )


def unsupported_ops(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The call nodes of ``gm`` torchax cannot lower (or whose output shapes an XLA program cannot fix, or which
    read a storage the program does not have: :func:`extra_ops.reads_logical_order`)."""
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and (is_data_dependent(n) or not has_lowering(n.target) or _strides_through_storage(n))
    ]


_AS_STRIDED = (torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default)


def _strides_through_storage(node: torch.fx.Node) -> bool:
    """An ``as_strided`` of a value the graph computed whose layout, as traced, is not its storage in logical
    order. Graph inputs reach the program as arrays the strides and offsets index from their first element (a
    DeferAndFuse graph's input buffers: :mod:`.planning` keys its slots that way)."""
    if node.target not in _AS_STRIDED or not isinstance(node.args[0], torch.fx.Node):
        return False
    if node.args[0].op == "placeholder":
        return False
    value = node.args[0].meta.get("val")
    return isinstance(value, torch.Tensor) and not extra_ops.reads_logical_order(value, node.args, node.kwargs)


@dataclass
class Lowered:
    """A compiled graph: call with the CPU input tensors, get the graph's outputs as CPU tensors.

    Inputs the graph wrote into have been updated in place when the call returns. The graph's float inputs
    reach the executable packed in one f64 vector (see :func:`compile_graph`)."""

    executable: Any
    out_spec: Any
    static_leaves: list[Any]  # graph outputs that are not tensors (None, ints), by flat position
    mutated_inputs: list[int]
    uses_rng: bool
    output_dtypes: list[torch.dtype | None]  # per flat output: torch's dtype (where a lowering's differs)
    # per flat output: the strides and offset the trace gave it where they are not dense row-major (else None)
    output_layouts: list[tuple[tuple[int, ...], int] | None] = field(default_factory=list)
    float_positions: list[int] = field(default_factory=list)  # inputs that are Python floats

    def __post_init__(self) -> None:
        # a flat list or tuple of outputs (every DeferAndFuse graph, most AOTAutograd ones) is built directly:
        # unflattening a pytree costs ~15 us a leaf
        spec = self.out_spec
        kind = list if spec.type is not None and issubclass(spec.type, list) else spec.type  # fx's immutable_list
        flat = kind in (list, tuple) and all(child.is_leaf() for child in spec.children())
        self._flat_type: type | None = kind if flat else None

    def __call__(self, inputs: Sequence[torch.Tensor | float]) -> Any:
        seed = _next_seed() if self.uses_rng else _NO_SEED
        if self.float_positions:
            floats = np.array([inputs[i] for i in self.float_positions], dtype=np.float64)
            flat, mutated = self.executable(
                seed, *[arrays.array(t) for t in inputs if isinstance(t, torch.Tensor)], floats
            )
        else:
            flat, mutated = self.executable(seed, *[arrays.array(t) for t in inputs])
        if mutated:  # one foreach copy: it casts where a lowering's dtype differs from torch's
            torch._foreach_copy_(
                [inputs[i] for i in self.mutated_inputs], [arrays.to_torch(value) for value in mutated]
            )
        leaves = list(self.static_leaves)
        outputs = iter(flat)
        dtypes, layouts = self.output_dtypes, self.output_layouts
        for i, leaf in enumerate(leaves):
            if leaf is _ARRAY:
                dtype = dtypes[i] if i < len(dtypes) else None
                result = arrays.result(next(outputs), dtype)
                if dtype is not None and result.dtype is not dtype:
                    result = result.to(dtype)
                layout = layouts[i] if i < len(layouts) else None
                leaves[i] = result if layout is None else arrays.laid_out(result, *layout)
        if self._flat_type is not None:
            return leaves if self._flat_type is list else tuple(leaves)
        return pytree.tree_unflatten(leaves, self.out_spec)


_ARRAY = object()  # placeholder in Lowered.static_leaves for an array output
# The executables take a PRNG seed and make their key inside: a key made on the host at each call
# (``jax.random.PRNGKey``: several eager JAX ops) cost ~0.4 ms, more than a small model's whole executable.
_NO_SEED = np.uint32(0)


def _next_seed() -> np.uint32:
    """A PRNG seed drawn from the device's generator (``torch.tpu.default_generators[0]``), not the CPU's: set by
    ``torch.manual_seed``, fresh each call, and the program's CPU stream stays where a CUDA run leaves it."""
    return np.uint32(generator.default.next_seed())


class _Interpreter(torch.fx.Interpreter):
    """Runs the graph on torchax tensors; constants (``get_attr``) become JAX constants of the executable."""

    def __init__(self, gm: torch.fx.GraphModule, env: Any) -> None:
        super().__init__(gm)
        self.torchax_env = env  # not ``self.env``: the Interpreter keeps its node values there

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            return self.torchax_env.j2t_iso(arrays.to_jax(value.detach().cpu()))
        return value


def _abstract(t: torch.Tensor | float) -> jax.ShapeDtypeStruct:
    if not isinstance(t, torch.Tensor):
        return jax.ShapeDtypeStruct((), jnp.float64, weak_type=True)  # a Python float is a double
    dtype = jnp.uint8 if t.dtype is torch.bool else torch_dtype_to_jax(t.dtype)  # bool's wire form: its bytes
    return jax.ShapeDtypeStruct(tuple(t.shape), dtype)


def _from_wire(value: jax.Array, is_bool: bool) -> jax.Array:
    """A bool input arrives as its bytes (see :func:`.arrays.array`): a uint8 array of 0s and 1s."""
    return value.astype(jnp.bool_) if is_bool else value


def _to_wire(value: jax.Array) -> jax.Array:
    """A bool output leaves as its bytes, which the CPU tensor over them reads as bool with no copy."""
    return value.astype(jnp.uint8) if value.dtype == jnp.bool_ else value


def torch_dtype_to_jax(dtype: torch.dtype) -> Any:
    torchax = torchax_compat.load()
    return torchax.ops.mappings.t2j_dtype(dtype)


@dataclass
class TracedGraph:
    """A graph as a JAX function ``function(seed, *arrays) -> (outputs, mutated inputs' new values)`` and the
    abstract arguments it is traced for. The XLA:CPU executable and the TPU estimate compile this same function.

    ``found`` is filled by the trace (output tree, static leaves, mutated input positions)."""

    function: Any
    abstract: list[jax.ShapeDtypeStruct]  # the PRNG seed first, then one per input
    found: dict[str, Any]


def trace_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor | float], precision: state.Precision
) -> TracedGraph:
    """``gm`` as a JAX function over arrays shaped like ``example_inputs`` (nothing is traced until it is lowered).

    Float inputs are Python scalars lifted out of the graph (see :mod:`.executor`), passed at each call."""
    env = environment()
    found: dict[str, Any] = {}
    is_tensor = [isinstance(t, torch.Tensor) for t in example_inputs]
    is_bool = [isinstance(t, torch.Tensor) and t.dtype is torch.bool for t in example_inputs]

    def jax_function(seed: jax.Array, *values: jax.Array) -> tuple[list[jax.Array], list[jax.Array]]:
        # float inputs stay raw (weakly typed) tracers: they stand for Python scalars of the graph's ops
        values = tuple(_from_wire(a, wire) for a, wire in zip(values, is_bool, strict=True))
        inputs = [env.j2t_iso(a) if tensor else a for tensor, a in zip(is_tensor, values, strict=True)]
        previous = _trace.precision
        _trace.precision = precision
        try:
            with env, env.override_property(prng=jax.random.key(seed)):
                result = _Interpreter(gm, env).run(*inputs)
                result = env.v2t_iso(result)
        finally:
            _trace.precision = previous
        leaves, spec = pytree.tree_flatten(result)
        arrays_out = []
        statics: list[Any] = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                arrays_out.append(_to_wire(env.t2j_iso(leaf)))
                statics.append(_ARRAY)
            else:
                statics.append(leaf)
        mutated = [i for i, (t, a) in enumerate(zip(inputs, values, strict=True)) if is_tensor[i] and t._elem is not a]
        found.update(spec=spec, statics=statics, mutated=mutated)
        return arrays_out, [_to_wire(inputs[i]._elem) for i in mutated]

    seed = jax.ShapeDtypeStruct((), jnp.uint32)
    return TracedGraph(jax_function, [seed, *(_abstract(t) for t in example_inputs)], found)


def compile_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor | float], precision: state.Precision
) -> Lowered:
    """Trace ``gm`` to JAX on torchax tensors and compile it with XLA for ``example_inputs``' shapes and dtypes.

    The graph's float inputs (an optimizer's learning rate and bias corrections: two or more per parameter) are
    packed into one f64 vector argument (a Python float is a double; weakly typed, each takes the dtype of the
    tensor it meets, as torch's scalars do): JAX turns each Python scalar argument into a device buffer of its own
    at every call, which cost more than the whole AdamW update of a small model."""
    traced = trace_graph(gm, example_inputs, precision)
    float_positions = [i for i, t in enumerate(example_inputs) if not isinstance(t, torch.Tensor)]
    function, abstract = traced.function, traced.abstract
    if float_positions:
        function, abstract = _packing_floats(traced, float_positions)
    executable = jax.jit(function).lower(*abstract).compile()
    return Lowered(
        executable=executable,
        out_spec=traced.found["spec"],
        static_leaves=traced.found["statics"],
        mutated_inputs=traced.found["mutated"],
        uses_rng=_uses_rng(gm),
        output_dtypes=_output_dtypes(gm),
        output_layouts=_output_layouts(gm),
        float_positions=float_positions,
    )


def _packing_floats(traced: TracedGraph, float_positions: list[int]) -> tuple[Any, list[jax.ShapeDtypeStruct]]:
    """``traced.function`` taking its float inputs as one f64 vector after the tensors, and its abstract args."""
    count = len(traced.abstract) - 1
    is_float = set(float_positions)
    tensor_positions = [i for i in range(count) if i not in is_float]

    def packed(seed: jax.Array, *values: jax.Array) -> Any:
        *tensors, floats = values
        merged: list[Any] = [None] * count
        for position, tensor in zip(tensor_positions, tensors, strict=True):
            merged[position] = tensor
        for index, position in enumerate(float_positions):
            # weakly typed, as the Python scalar it stands for (``x_bf16 * lr`` stays bf16)
            merged[position] = _convert_element_type(floats[index], weak_type=True)
        return traced.function(seed, *merged)

    abstract = [
        traced.abstract[0],
        *(traced.abstract[1 + i] for i in tensor_positions),
        jax.ShapeDtypeStruct((len(float_positions),), jnp.float64),
    ]
    return packed, abstract


def _traced_outputs(gm: torch.fx.GraphModule) -> list[Any]:
    """The tracer's example value of each of the graph's outputs, in flat order (None where it recorded none)."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return [
        leaf.meta.get("val") if isinstance(leaf, torch.fx.Node) else None for leaf in pytree.tree_leaves(output.args[0])
    ]


def _output_dtypes(gm: torch.fx.GraphModule) -> list[torch.dtype | None]:
    """torch dtypes of the graph's tensor outputs, in flat order, from the tracer's metadata."""
    return [value.dtype if isinstance(value, torch.Tensor) else None for value in _traced_outputs(gm)]


def _output_layouts(gm: torch.fx.GraphModule) -> list[tuple[tuple[int, ...], int] | None]:
    """The strides of each tensor output that the trace gave a dense layout other than row-major (a transposed
    activation AOTAutograd saves for the backward, whose graph then ``view``s it as traced). Outputs with gaps or
    overlaps (an ``expand``) stay row-major: their layout cannot be written by a copy, and no kernel reads it."""
    layouts: list[tuple[tuple[int, ...], int] | None] = []
    for value in _traced_outputs(gm):
        layout = None
        if isinstance(value, torch.Tensor) and value.layout is torch.strided:
            stride = value.stride()
            concrete = all(isinstance(n, int) for n in (*value.shape, *stride))
            if concrete and not value.is_contiguous() and extra_ops.is_dense(value.shape, stride):
                layout = (tuple(stride), 0)
        layouts.append(layout)
    return layouts


def _uses_rng(gm: torch.fx.GraphModule) -> bool:
    """Whether a call of ``gm`` draws its seed from torch's generator: not when its random ops drop nothing (the
    fused attention ops are random by tag, and a model's attention runs them at ``dropout_p=0.0`` on every call:
    each seed drawn would move the program's own random stream, its batch order, away from the CPU's)."""
    return any(n.op == "call_function" and _is_random(n.target) and not _drops_nothing(n) for n in gm.graph.nodes)


def _drops_nothing(node: torch.fx.Node) -> bool:
    """A random op whose dropout probability is a literal zero in the graph."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    for position, argument in enumerate(schema.arguments):
        if argument.name in ("dropout_p", "p"):
            if position < len(node.args):
                value = node.args[position]
            else:  # left out: the schema's default (attention's dropout_p is 0.0)
                value = node.kwargs.get(argument.name, argument.default_value)
            return isinstance(value, (int, float)) and value == 0
    return False


def _is_random(target: Any) -> bool:
    tags = getattr(target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags
