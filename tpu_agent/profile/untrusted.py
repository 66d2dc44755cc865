"""A capture on disk is untrusted input: the one place that reads it defensively and confines every write.

``tpu-agent diagnose`` (and the MCP server's ``tpu_diagnose``) run on log directories that someone else may
have written: a session name of ``../../..`` in ``options.json``, a ``tpu-agent`` directory that is a
symlink to ``/etc``, a truncated ``.xplane.pb`` or a JSON file with the wrong types must give a clear error
naming the file (exit code 2), never a write outside the log directory and never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from tpu_agent.errors import ExitCode, TpuAgentError

DAMAGED_HINT = "re-run `tpu-agent profile` to capture again, or point diagnose at an undamaged log directory"
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_INT_LIMIT = 2**63  # what a protobuf int64 or a timestamp in ns can hold; larger is damage, not data
_READ_ERRORS = (
    OSError,
    ValueError,
    KeyError,
    TypeError,
    IndexError,
    AttributeError,
    ArithmeticError,
    RecursionError,
    DecodeError,
)


def damaged(path: Path, what: str) -> TpuAgentError:
    return TpuAgentError("damaged-capture", f"{path}: {what}", DAMAGED_HINT)


@contextlib.contextmanager
def reading(path: Path, what: str) -> Iterator[None]:
    """Turn any failure while reading ``path`` into a ``damaged-capture`` error that names it."""
    try:
        yield
    except TpuAgentError as error:  # e.g. an unknown chip name: still say which file holds it
        if str(path) in error.message:
            raise
        raise dataclasses.replace(error, message=f"{path}: {error.message}") from None
    except _READ_ERRORS as error:
        detail = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise damaged(
            path, f"{what} is damaged or not what tpu-agent wrote ({type(error).__name__}: {detail})"
        ) from None


def safe_name(value: object, path: Path, field: str) -> str:
    """A file or directory name read from a capture: one path component of plain characters, nothing else."""
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value) or value in (".", ".."):
        raise TpuAgentError(
            "unsafe-capture",
            f"{path}: {field} {str(value)[:80]!r} is not a plain file name; refusing to write anywhere it points",
            "this capture was not written by `tpu-agent profile`; re-run the profile",
            ExitCode.REFUSED,
        )
    return value


def confined(root: Path, path: Path) -> Path:
    """``path`` resolved (symlinks followed), refused unless it stays inside ``root`` (also resolved)."""
    resolved_root = root.resolve()
    resolved = path.resolve()
    if resolved != resolved_root and not resolved.is_relative_to(resolved_root):
        raise TpuAgentError(
            "path-outside-logdir",
            f"{path} leads to {resolved}, outside the log directory {resolved_root}; refusing to write there",
            "remove the symlink (or the crafted path) from the capture, or diagnose a copy of it",
            ExitCode.REFUSED,
        )
    return resolved


def conforms(value: Any, annotation: Any) -> bool:
    """Whether a value parsed from JSON matches a dataclass field's type (``int | None``, ``dict[str, int]``...)."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if annotation is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in typing.get_args(annotation))
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool) and -_INT_LIMIT < value < _INT_LIMIT
    if annotation is float:
        return (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and abs(value) < 1e300
        )
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple):
        args = typing.get_args(annotation)
        item = args[0] if args else Any
        return isinstance(value, (list, tuple)) and all(conforms(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(annotation) or (Any, Any)
        return isinstance(value, dict) and all(conforms(k, key) and conforms(v, item) for k, v in value.items())
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return isinstance(value, annotation) and valid_dataclass(value)
    return isinstance(value, annotation) if isinstance(annotation, type) else True


_hints: dict[type, dict[str, Any]] = {}


def valid_dataclass(obj: Any) -> bool:
    """Every field of a dataclass instance built from untrusted data has its declared type."""
    cls = type(obj)
    if cls not in _hints:
        _hints[cls] = typing.get_type_hints(cls)
    return all(
        conforms(getattr(obj, f.name), _hints[cls][f.name]) for f in dataclasses.fields(obj) if f.name in _hints[cls]
    )
