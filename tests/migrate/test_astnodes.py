"""The shared node list of a stdlib tree (analysis/astnodes.py) must be ``ast.walk``'s order exactly: the
analyses that read it keep the first or last of something, and their results must not change."""

from __future__ import annotations

import ast
import weakref
from pathlib import Path

from tpu_agent.migrate.analysis.astnodes import depth, nodes

FIXTURES = Path(__file__).parent / "fixtures"


def test_nodes_are_ast_walk_in_order_and_listed_once() -> None:
    paths = sorted(FIXTURES.glob("*.in.py"))
    assert paths
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        listed = list(nodes(tree))
        walked = list(ast.walk(tree))
        assert len(listed) == len(walked) and all(a is b for a, b in zip(listed, walked, strict=True)), path.name
        assert all(a is b for a, b in zip(nodes(tree), listed, strict=True))  # listed once, read again
    match = ast.parse("match x:\n    case {'a': [y, *rest], **kw} if y:\n        pass\n")
    assert [type(n) for n in nodes(match)] == [type(n) for n in ast.walk(match)]


def test_the_list_lives_no_longer_than_its_tree() -> None:
    """The cache must not keep a tree (and a file's worth of nodes) alive after the file is migrated."""
    tree = ast.parse("def f(x):\n    return [y for y in x]\n")
    assert depth(tree) == 7  # Module, FunctionDef, Return, ListComp, comprehension, Name, Load
    assert sum(1 for _ in nodes(tree)) == sum(1 for _ in ast.walk(tree))
    reference = weakref.ref(tree)
    del tree
    assert reference() is None
