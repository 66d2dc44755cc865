"""A capture on disk is untrusted input: the one place that reads it defensively and confines every write.

``tpu-agent diagnose`` (and the MCP server's ``tpu_diagnose``) run on log directories that someone else may
have written: a session name of ``../../..`` in ``options.json``, a ``tpu-agent`` directory that is a
symlink to ``/etc``, a truncated ``.xplane.pb`` or a JSON file with the wrong types must give a clear error
naming the file (exit code 2), never a write outside the log directory and never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
import stat
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.fsutil import atomic_write_bytes, not_regular

DAMAGED_HINT = "re-run `tpu-agent profile` to capture again, or point diagnose at an undamaged log directory"
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: The largest capture file diagnose reads (protobuf's own limit for an XSpace); a larger one is damage, not data.
MAX_CAPTURE_FILE_BYTES = 2**31 - 1
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


def vet_files(directory: Path) -> None:
    """Refuse a capture directory holding anything diagnose could read that is not a plain file of readable size:
    a symlink, FIFO or device planted under a record's name (``/dev/zero`` never ends, a FIFO blocks the
    reader forever) is named as damage before any record is opened. Checked with ``lstat``, so nothing is
    followed; subdirectories are not read and pass."""
    for path in sorted(directory.iterdir()):
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            continue
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else not_regular(info.st_mode)
        if kind is not None:
            raise damaged(path, f"{kind}, where tpu-agent writes plain files: not read")
        if info.st_size > MAX_CAPTURE_FILE_BYTES:
            raise damaged(path, f"{info.st_size} bytes, more than the {MAX_CAPTURE_FILE_BYTES} diagnose reads")


def write_confined(root: Path, path: Path, data: bytes) -> None:
    """The one way diagnose writes into a log directory: the file itself is checked before the atomic write,
    because a symlink planted at a report's or an XSpace's own name leads out as surely as one at a directory
    (and :func:`tpu_agent.fsutil.atomic_write_bytes` writes through links)."""
    confined(root, path)
    atomic_write_bytes(path, data)


Checker = Callable[[Any], bool]


def _int(value: Any) -> bool:
    return type(value) is int and -_INT_LIMIT < value < _INT_LIMIT


def _float(value: Any) -> bool:
    return (type(value) is float and math.isfinite(value) and abs(value) < 1e300) or _int(value)


_SIMPLE: dict[Any, Checker] = {
    int: _int,
    float: _float,
    bool: lambda value: type(value) is bool,
    str: lambda value: type(value) is str,
    type(None): lambda value: value is None,
    Any: lambda value: True,
}


@functools.cache
def checker(annotation: Any) -> Checker:
    """A function telling whether a value parsed from JSON has a dataclass field's type (``int | None``,
    ``list[list[int]]``, ``dict[str, int]``, a nested dataclass), built once per type: a capture holds
    ~10^5 records, and walking ``typing`` objects for each would cost more than the analysis."""
    if annotation in _SIMPLE:
        return _SIMPLE[annotation]
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        options = tuple(checker(arg) for arg in args)
        return lambda value: any(check(value) for check in options)
    if origin in (list, tuple):
        item = checker(args[0]) if args else _SIMPLE[Any]
        return lambda value: isinstance(value, (list, tuple)) and all(item(v) for v in value)
    if origin is dict:
        key, item = (checker(args[0]), checker(args[1])) if args else (_SIMPLE[Any], _SIMPLE[Any])
        return lambda value: isinstance(value, dict) and all(key(k) and item(v) for k, v in value.items())
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return lambda value: isinstance(value, annotation) and valid_dataclass(value)
    if isinstance(annotation, type):
        return lambda value: isinstance(value, annotation)
    return _SIMPLE[Any]


@functools.cache
def _field_checkers(cls: type) -> tuple[tuple[str, Checker], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, checker(hints[f.name])) for f in dataclasses.fields(cls) if f.name in hints)


def valid_dataclass(obj: Any) -> bool:
    """Every field of a dataclass instance built from untrusted data has its declared type."""
    cls: type = type(obj)
    return all(check(getattr(obj, name)) for name, check in _field_checkers(cls))
