"""torch.Event / torch.Stream on the emulated tpu in DeferAndFuse: prints one JSON object of observations."""

import json
import time

import torch

from tpu_agent.runtime.emulated import activate

activate(eager_mode="defer_and_fuse")
out: dict = {}


def error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test compares type and text
        return {"type": type(e).__name__, "message": str(e)}
    return None


start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
out["classes"] = {"is_tpu_event": type(start) is torch.tpu.Event, "is_torch_event": isinstance(start, torch.Event), "device": str(start.device)}
x = torch.randn(64, 64, device="tpu")
y = x @ x
start.record()  # LINE record
out["recorded_work_ran"] = y._elem is not None
z = y.relu()
time.sleep(0.05)
end.record()
end.synchronize()
out["end_work_ran"] = z._elem is not None
out["elapsed"] = start.elapsed_time(end)
out["query"] = end.query()
untimed = torch.Event()
untimed.record()
out["untimed"] = error_of(lambda: untimed.elapsed_time(end))
out["unrecorded"] = error_of(lambda: start.elapsed_time(torch.Event(enable_timing=True)))
out["other_index"] = error_of(lambda: torch.Event(device="tpu:1"))

current = torch.accelerator.current_stream()
side = torch.Stream()
done = side.record_event()
with side:
    w = x * 2
    out["inside"] = repr(torch.accelerator.current_stream())
side.wait_event(start)
current.wait_stream(side)
side.synchronize()  # LINE stream_sync
out["streams"] = {
    "current_is_tpu_stream": type(current) is torch.tpu.Stream,
    "new_is_tpu_stream": type(side) is torch.tpu.Stream,
    "is_torch_stream": isinstance(side, torch.Stream),
    "repr": repr(side),
    "record_event_is_tpu_event": type(done) is torch.tpu.Event,
    "work_inside_ran": w._elem is not None,
    "by_id_is_tpu_stream": type(torch.Stream(stream_id=0, device_index=0, device_type=side.device_type)) is torch.tpu.Stream,
}
out["stream_query"] = error_of(side.query)
print(json.dumps(out))
