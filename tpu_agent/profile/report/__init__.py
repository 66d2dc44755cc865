"""Renderers of a :class:`~tpu_agent.profile.model.Diagnosis`: text (rich), json, markdown, html.

All four read the one JSON document built by :func:`tpu_agent.profile.report.document.build_document`, so
they cannot disagree about a number.
"""

from __future__ import annotations

import json

from tpu_agent.errors import TpuAgentError
from tpu_agent.profile.model import Diagnosis

FORMATS = ("text", "json", "markdown", "html")


def render(diagnosis: Diagnosis, fmt: str) -> str:
    """``diagnosis`` as a string in ``fmt`` (text | json | markdown | html)."""
    data = diagnosis.to_dict()
    if fmt == "json":
        return json.dumps(data, indent=2, default=str) + "\n"
    if fmt == "text":
        from tpu_agent.profile.report.text import render_text

        return render_text(data)
    if fmt == "markdown":
        from tpu_agent.profile.report.markdown import render_markdown

        return render_markdown(data)
    if fmt == "html":
        from tpu_agent.profile.report.html import render_html

        return render_html(data)
    raise TpuAgentError("bad-format", f"unknown report format {fmt!r}", f"use one of: {', '.join(FORMATS)}")


__all__ = ["FORMATS", "render"]
