"""Reading MCP tool results in the plugin tests (imported at module level by the test files)."""

from __future__ import annotations

import json
from typing import Any


def tool_error(result: Any) -> dict[str, str]:
    """The JSON copy of a tool error (the last line of its text)."""
    assert result.is_error, result
    return json.loads(result.content[0].text.strip().splitlines()[-1])["error"]


def tool_content(result: Any) -> dict[str, Any]:
    """The structured answer of a tool call that must have succeeded (its error text otherwise)."""
    assert not result.is_error, result.content[0].text if result.content else result
    return result.structured_content
