"""The output text of a changed module: untouched top-level statements keep their original text.

Generating a whole module's code costs about as much as parsing it; most statements of a migrated file
did not change, so their text is copied from the source and only changed or added statements are
generated. The result is the same text as ``new.code`` (a property test checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import libcst as cst

from tpu_agent.migrate.engine.rulepass import Edits


def same_lines(a: Sequence[cst.EmptyLine], b: Sequence[cst.EmptyLine]) -> bool:
    return len(a) == len(b) and all(x.deep_equals(y) for x, y in zip(a, b, strict=True))


class Spliced(NamedTuple):
    code: str
    # (offset in ``code``, text) of each generated top-level statement or footer line: the only parts of the code
    # that can hold an error, since the rest is the source's own text
    generated: list[tuple[int, str]]


def splice(
    source: str, original: cst.Module, new: cst.Module, spans: dict[int, tuple[int, int]], edits: Edits
) -> Spliced:
    """The new module's code from the original text of every untouched top-level statement plus the code of
    the changed and added ones (removed ones leave their text out; a changed footer is generated): the same text
    as ``new.code``, without generating what did not change."""
    parts = [source[: spans[id(original.body[0])][0]]] if original.body else [source]
    generated: list[tuple[int, str]] = []
    offset = len(parts[0])

    def generate(node: cst.CSTNode) -> None:
        nonlocal offset
        text = new.code_for_node(node)
        generated.append((offset, text))
        parts.append(text)
        offset += len(text)

    for stmt, old in zip(new.body, edits.origins, strict=True):
        if old is None or old in edits.dirty:
            generate(stmt)
        else:
            start, end = spans[id(original.body[old])]
            parts.append(source[start:end])
            offset += end - start
    if not original.body:
        return Spliced("".join(parts), generated)
    if same_lines(original.footer, new.footer):
        parts.append(source[spans[id(original.body[-1])][1] :])
    else:  # comments of a removed last statement were carried into the footer
        for line in new.footer:
            generate(line)
    return Spliced("".join(parts), generated)
