"""The compiler stack under the emulated ``tpu`` device: captured ATen graphs lowered to JAX and run by XLA.

* :mod:`.jax_setup`: JAX on the CPU platform, with a persistent compilation cache.
* :mod:`.torchax_compat`: the one module that makes torchax importable here.
* :mod:`.lowering`: an ATen FX graph -> a JAX function (torchax's op table, the device's MXU numerics) -> XLA.
* :mod:`.graphs`: run a graph through cached executables, split around ops without a lowering.
* :mod:`.cache`: the bounded executable cache and its Compile events.
* :mod:`.dynamo`: ``torch.compile(backend="tpu")`` through AOTAutograd into :mod:`.graphs`.
* :mod:`.executor`: the DeferAndFuse executor that compiles captured graphs.
* :mod:`.settings`: the ``--compiler xla|eager`` switch (no JAX import).
"""
