"""``torch_tpu._internal.utils``: debugging helpers (``utils.OpTracer``, ``utils.assert_close``)."""
