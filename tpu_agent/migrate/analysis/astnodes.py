"""Every node of a stdlib ``ast`` tree, listed once per tree and shared by the analyses that read the whole tree.

Why: the gate's held names, the module's bindings, the names bound in any scope and the unpacked mappings each
walked the whole tree of the same file with ``ast.walk``, a generator over ``ast.iter_child_nodes`` that costs
more than the checks made on the nodes; on the twelve public repositories of issue 28 those walks took a tenth
of the migration's time. :func:`nodes` builds the list once per tree (reading the fields itself, at a fraction
of the generator's cost) and keeps it as long as the tree lives (not longer: the list holds no reference to
the root, and stdlib nodes hold none to their parents), so each further analysis is one loop over a
list.

The list is in ``ast.walk``'s order (breadth first, children in field order), so an analysis that keeps the
first or the last of something finds the same node as before. Trees are never changed after parsing in this
package; a caller that changed one would have to parse it again.
"""

from __future__ import annotations

import ast
import weakref
from collections.abc import Iterator
from itertools import chain

# tree -> its nodes below the root: the root itself is not held, so the entry goes when the tree does
_BELOW: weakref.WeakKeyDictionary[ast.AST, list[ast.AST]] = weakref.WeakKeyDictionary()


def nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk(tree)``, its nodes listed once per tree."""
    below = _BELOW.get(tree)
    if below is None:
        below = _BELOW[tree] = _breadth_first(tree)[0]
    return chain((tree,), below)


def depth(tree: ast.AST) -> int:
    """How many levels deep ``tree`` is (1 for a lone node), found while listing its :func:`nodes`: the guard's
    depth check and the analyses share one walk of the file."""
    below, levels = _breadth_first(tree)
    _BELOW[tree] = below
    return levels


def _breadth_first(tree: ast.AST) -> tuple[list[ast.AST], int]:
    """The nodes below ``tree`` in ``ast.walk``'s order, level by level (each level's children in order, as
    ``ast.walk``'s queue holds them), the children being those ``ast.iter_child_nodes`` yields, in its order; and
    the number of levels, the root's included."""
    found: list[ast.AST] = []
    level: list[ast.AST] = [tree]
    levels = 0
    node_type = ast.AST
    while level:
        levels += 1
        below: list[ast.AST] = []
        append = below.append
        for node in level:
            for name in node._fields:
                value = getattr(node, name, None)
                if isinstance(value, list):
                    for item in value:
                        if isinstance(item, node_type):
                            append(item)
                elif isinstance(value, node_type):
                    append(value)
        found.extend(below)
        level = below
    return found, levels
