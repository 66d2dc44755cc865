"""The input pipeline: each DataLoader's settings and the line that built it, and time spent waiting in
``__next__`` during the analysed steps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tpu_agent.profile.capture._probe import Probe, site_dict
from tpu_agent.profile.capture.steps import StepClock
from tpu_agent.runtime import events as ev


class DataLoaderProbe(Probe):
    def __init__(self, clock: StepClock) -> None:
        super().__init__()
        self.clock = clock
        self.loaders: list[dict[str, Any]] = []
        self.waits: list[dict[str, Any]] = []

    def install(self) -> None:
        from torch.utils.data import dataloader as dl

        self.patch(dl._BaseDataLoaderIter, "__next__", self._wrap_next)
        self.patch(dl.DataLoader, "__init__", self._wrap_init)

    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        clock = self.clock

        def __next__(it: Any) -> Any:
            clock.first_activity()
            start = time.time_ns()
            try:
                return original(it)
            finally:
                if clock.in_analysed_steps:  # only the steps the analysis reads, however long the run
                    self.waits.append(
                        {
                            "step": clock.log.step,
                            "duration_ns": time.time_ns() - start,
                            "time_ns": start,
                            "site": site_dict(ev.user_call_site(2)),
                        }
                    )

        return __next__

    def _wrap_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            original(loader, *args, **kwargs)
            try:
                dataset_len = len(loader.dataset)
            except TypeError:
                dataset_len = None
            self.loaders.append(
                {
                    "batch_size": loader.batch_size,
                    "num_workers": loader.num_workers,
                    "drop_last": bool(loader.drop_last),
                    "dataset_len": dataset_len,
                    "site": site_dict(ev.user_call_site(2)),
                }
            )

        return __init__

    def record(self) -> dict[str, Any]:
        return {"dataloaders": self.loaders, "data_waits": self.waits}
