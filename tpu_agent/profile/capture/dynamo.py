"""torch.compile: Dynamo's graph-break and recompile logs turned into runtime events with their user lines.

Graph breaks are always recorded (Dynamo's message carries the explanation the rules quote); recompiles
only where the emulated device does not already log them as Compile records.
"""

from __future__ import annotations

import contextlib
import logging
import re

from tpu_agent.profile.capture._probe import Probe
from tpu_agent.profile.sources import function_at
from tpu_agent.runtime import events as ev

GRAPH_BREAK_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
RECOMPILE_LOGGER = "torch._dynamo.guards.__recompiles"
_GRAPH_BREAK_RE = re.compile(
    r"Graph break.*? in user code at (?P<file>.+?):(?P<line>\d+)\s*\nGraph Break Reason: (?P<reason>.*)"
)
_RECOMPILE_RE = re.compile(
    r"Recompiling function (?P<func>\S+) in (?P<file>.+?):(?P<line>\d+)\s+triggered by.*?- (?P<reason>[^\n]+)",
    re.DOTALL,
)
_EXPLANATION_RE = re.compile(r"Explanation: (.+)")


def on_dynamo_log(message: str) -> None:
    """Emit the GraphBreak or Compile(is_recompile) record one Dynamo log message describes, if any."""
    match = _GRAPH_BREAK_RE.search(message)
    if match:
        site = ev.Site(match["file"], int(match["line"]), function_at(match["file"], int(match["line"])))
        explanation = _EXPLANATION_RE.search(message)
        reason = explanation.group(1).strip() if explanation else match["reason"].strip()
        ev.emit(ev.GraphBreak, reason=reason, site=site)
        return
    match = _RECOMPILE_RE.search(message)
    if match:
        ev.emit(
            ev.Compile,
            function=match["func"],
            graph_id=-1,
            graph_ops=0,
            is_recompile=True,
            reason=match["reason"].strip().split(": ", 1)[-1],
            duration_ns=0,
            site=ev.Site(match["file"], int(match["line"]), match["func"]),
        )


class _Handler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        on_dynamo_log(record.getMessage())


class DynamoProbe(Probe):
    def __init__(self, emulated: bool) -> None:
        super().__init__()
        self.emulated = emulated

    def install(self) -> None:
        names = [GRAPH_BREAK_LOGGER]
        if not self.emulated:  # the emulated device logs its own compiles, with the recompile reason
            names.append(RECOMPILE_LOGGER)
            with contextlib.suppress(AttributeError, ImportError):
                from torch._logging import _internal

                _internal.log_state.enable_artifact("recompiles")
        for name in names:
            logger = logging.getLogger(name)
            logger.handlers = [_Handler()]
            logger.propagate = False
            logger.setLevel(logging.DEBUG)
