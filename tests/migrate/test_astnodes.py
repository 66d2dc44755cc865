"""The shared node list of a stdlib tree (analysis/astnodes.py) must be ``ast.walk``'s order exactly: the
analyses that read it keep the first or last of something, and their results must not change."""

from __future__ import annotations

import ast
from pathlib import Path

from tpu_agent.migrate.analysis.astnodes import nodes

FIXTURES = Path(__file__).parent / "fixtures"


def test_nodes_are_ast_walk_in_order_and_listed_once() -> None:
    paths = sorted(FIXTURES.glob("*.in.py"))
    assert paths
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        listed = nodes(tree)
        walked = list(ast.walk(tree))
        assert len(listed) == len(walked) and all(a is b for a, b in zip(listed, walked, strict=True)), path.name
        assert nodes(tree) is listed  # the second analysis of the same tree reads the same list
    match = ast.parse("match x:\n    case {'a': [y, *rest], **kw} if y:\n        pass\n")
    assert [type(n) for n in nodes(match)] == [type(n) for n in ast.walk(match)]
