"""Compare our CUDA row softmax with torch.softmax (run by hand on a GPU box)."""

from pathlib import Path

import torch
from torch.utils.cpp_extension import load

HERE = Path(__file__).parent


def main() -> None:
    ext = load(name="row_softmax", sources=[str(HERE / "softmax.cu")], verbose=False)
    x = torch.randn(4096, 1024, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        ext.row_softmax(x)
    end.record()
    torch.cuda.synchronize()
    print(f"custom: {start.elapsed_time(end) / 100:.3f} ms")
    torch.testing.assert_close(ext.row_softmax(x), torch.softmax(x, dim=1))


if __name__ == "__main__":
    main()
