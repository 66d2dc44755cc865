"""A GPT training step written directly in JAX, with its parameter count and FLOPs known analytically, so the
TPU compiler's figures can be checked against arithmetic rather than against themselves."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_agent.estimate.model import ArgRole, ArgSpec, StepProgram


@dataclass(frozen=True)
class GptShape:
    vocab: int = 256
    d_model: int = 128
    layers: int = 2
    heads: int = 4
    seq: int = 64
    batch: int = 8

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab, self.d_model)}
        for layer in range(self.layers):
            shapes |= {
                f"l{layer}.qkv": (self.d_model, 3 * self.d_model),
                f"l{layer}.proj": (self.d_model, self.d_model),
                f"l{layer}.up": (self.d_model, 4 * self.d_model),
                f"l{layer}.down": (4 * self.d_model, self.d_model),
            }
        return shapes

    @property
    def parameters(self) -> int:
        total = 0
        for shape in self.parameter_shapes().values():
            count = 1
            for dim in shape:
                count *= dim
            total += count
        return total

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def training_flops(self) -> float:
        """6 x parameters x tokens (forward 2, backward 4) plus causal attention's QK^T and AV: 12 x layers x
        seq x d_model per token (forward 4, backward 8), the figure the issue's check asks for."""
        return 6.0 * self.parameters * self.tokens + 12.0 * self.layers * self.seq * self.d_model * self.tokens


def train_step_program(shape: GptShape, dtype: str = "float32", parameter_shard_dim: int | None = None) -> StepProgram:
    """A full step: forward, loss, backward and an AdamW update, as one program over params, m, v and tokens."""
    import jax
    import jax.numpy as jnp

    names = list(shape.parameter_shapes())
    count = len(names)

    def forward(params: dict[str, jax.Array], tokens: jax.Array) -> jax.Array:
        x = params["embed"][tokens]
        causal = jnp.tril(jnp.ones((tokens.shape[1], tokens.shape[1]), dtype=bool))
        head_dim = shape.d_model // shape.heads
        for layer in range(shape.layers):
            h = x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
            q, k, v = jnp.split(h @ params[f"l{layer}.qkv"], 3, axis=-1)
            split = lambda t: t.reshape(*t.shape[:2], shape.heads, head_dim).transpose(0, 2, 1, 3)  # noqa: E731
            scores = jnp.where(causal, split(q) @ split(k).transpose(0, 1, 3, 2) / head_dim**0.5, -1e9)
            attended = (jax.nn.softmax(scores, axis=-1) @ split(v)).transpose(0, 2, 1, 3).reshape(x.shape)
            x = x + attended @ params[f"l{layer}.proj"]
            x = x + jax.nn.gelu(x @ params[f"l{layer}.up"]) @ params[f"l{layer}.down"]
        logits = x @ params["embed"].T
        targets = jnp.roll(tokens, -1, axis=1)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1))

    def step(*flat: jax.Array) -> tuple[jax.Array, ...]:
        params = dict(zip(names, flat[:count], strict=True))
        m, v, tokens = flat[count : 2 * count], flat[2 * count : 3 * count], flat[-1]
        loss, grads = jax.value_and_grad(forward)(params, tokens)
        new_params, new_m, new_v = [], [], []
        for index, name in enumerate(names):
            g = grads[name]
            m_i = 0.9 * m[index] + 0.1 * g
            v_i = 0.999 * v[index] + 0.001 * g * g
            p = params[name]
            new_params.append(p - 1e-3 * (m_i / (jnp.sqrt(v_i) + 1e-8) + 0.01 * p))
            new_m.append(m_i)
            new_v.append(v_i)
        return (loss, *new_params, *new_m, *new_v)

    shapes = shape.parameter_shapes()
    params = [ArgSpec(name, shapes[name], dtype, ArgRole.PARAMETER, parameter_shard_dim) for name in names]
    state = [
        ArgSpec(f"{kind}.{name}", shapes[name], dtype, ArgRole.OPTIMIZER_STATE, parameter_shard_dim)
        for kind in ("m", "v")
        for name in names
    ]
    tokens = ArgSpec("tokens", (shape.batch, shape.seq), "int32", ArgRole.BATCH, 0)
    return StepProgram("train_step", step, (*params, *state, tokens), donated=tuple(range(3 * count)))


def wide_mlp_step_program(d_model: int, hidden: int, batch: int, dtype: str = "float32") -> StepProgram:
    """Two huge weights and a plain SGD-with-momentum update: a model whose state outgrows a chip while its
    program stays a handful of ops, so the compiler answers in seconds."""
    import jax
    import jax.numpy as jnp

    def loss_fn(w_in: jax.Array, w_out: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.mean((jax.nn.relu(x @ w_in) @ w_out - x) ** 2)

    def step(
        w_in: jax.Array, w_out: jax.Array, m_in: jax.Array, m_out: jax.Array, x: jax.Array
    ) -> tuple[jax.Array, ...]:
        loss, (g_in, g_out) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w_in, w_out, x)
        m_in, m_out = 0.9 * m_in + g_in, 0.9 * m_out + g_out
        return loss, w_in - 1e-3 * m_in, w_out - 1e-3 * m_out, m_in, m_out

    args = (
        ArgSpec("w_in", (d_model, hidden), dtype, ArgRole.PARAMETER),
        ArgSpec("w_out", (hidden, d_model), dtype, ArgRole.PARAMETER),
        ArgSpec("m_in", (d_model, hidden), dtype, ArgRole.OPTIMIZER_STATE),
        ArgSpec("m_out", (hidden, d_model), dtype, ArgRole.OPTIMIZER_STATE),
        ArgSpec("x", (batch, d_model), dtype, ArgRole.BATCH, 0),
    )
    return StepProgram("train_step", step, args, donated=(0, 1, 2, 3))
