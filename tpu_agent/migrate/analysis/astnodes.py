"""Every node of a stdlib ``ast`` tree, listed once per tree and shared by the analyses that read the whole tree.

Why: the gate's held names, the module's bindings, the names bound in any scope and the unpacked mappings each
walked the whole tree of the same file with ``ast.walk``, a generator over ``ast.iter_child_nodes`` that costs
more than the checks made on the nodes; on the twelve public repositories of issue 28 those walks took a tenth
of the migration's time. :func:`nodes` builds the list once per tree (reading the fields itself, at a fraction
of the generator's cost) and keeps it as long as the tree lives, so each further analysis is one loop over a
list.

The list is in ``ast.walk``'s order (breadth first, children in field order), so an analysis that keeps the
first or the last of something finds the same node as before. Trees are never changed after parsing in this
package; a caller that changed one would have to parse it again.
"""

from __future__ import annotations

import ast
import weakref

_LISTED: weakref.WeakKeyDictionary[ast.AST, list[ast.AST]] = weakref.WeakKeyDictionary()


def nodes(tree: ast.AST) -> list[ast.AST]:
    """``list(ast.walk(tree))``, computed once per tree."""
    listed = _LISTED.get(tree)
    if listed is None:
        listed = _LISTED[tree] = _breadth_first(tree)
    return listed


def _breadth_first(tree: ast.AST) -> list[ast.AST]:
    """The nodes in ``ast.walk``'s order: the list is its own queue (a node's children are appended when the
    node is reached), and the children are those ``ast.iter_child_nodes`` yields, in its order."""
    found: list[ast.AST] = [tree]
    append, node_type = found.append, ast.AST
    index = 0
    while index < len(found):
        node = found[index]
        index += 1
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, node_type):
                        append(item)
            elif isinstance(value, node_type):
                append(value)
    return found
