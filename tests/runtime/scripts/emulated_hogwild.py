"""pytorch/examples' mnist_hogwild on the tpu device: a model shared with multiprocessing workers. Sending the tpu
model to a spawned process must fail at once with what to do instead; torch.save of it and Hogwild on the CPU
keep working. Prints one JSON line."""

import io
import json

import torch
import torch.multiprocessing as mp

from tpu_agent.runtime.emulated import activate


def train(model: torch.nn.Module) -> None:
    with torch.no_grad():
        model.weight.add_(1.0)  # Hogwild: the parent sees the shared update


if __name__ == "__main__":
    activate()
    mp.set_start_method("spawn", force=True)
    results = {}
    on_tpu = torch.nn.Linear(2, 2).to("tpu")
    on_tpu.share_memory()
    try:
        mp.Process(target=train, args=(on_tpu,)).start()
        results["tpu"] = "started"
    except RuntimeError as error:
        results["tpu"] = str(error)
    buffer = io.BytesIO()
    torch.save(on_tpu.state_dict(), buffer)
    results["saved"] = buffer.tell() > 0
    on_cpu = torch.nn.Linear(2, 2)
    on_cpu.share_memory()
    before = on_cpu.weight.sum().item()
    worker = mp.Process(target=train, args=(on_cpu,))
    worker.start()
    worker.join()
    results["cpu_update"] = round(on_cpu.weight.sum().item() - before, 4)
    print(json.dumps(results))
