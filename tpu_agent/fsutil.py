"""File writes that never leave a user file half-written, and where tpu-agent keeps its caches.

Every subpackage that writes a user-visible file (migrated sources, reports, harness configs, profiles)
goes through :func:`atomic_write_bytes` / :func:`atomic_write_text`: the data goes to a temporary file in
the same directory, is flushed and fsynced, takes the original file's permission bits, and then replaces
the target with one ``os.replace``. A crash at any point leaves either the old file or the new one.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

CACHE_DIR_ENV = "TPU_AGENT_CACHE_DIR"


def user_cache_dir(kind: str) -> Path:
    """Where tpu-agent keeps one kind of cache (``estimate``: TPU compile results, ``xla``: the emulated device's
    executables): ``$TPU_AGENT_CACHE_DIR/<kind>``, else ``$XDG_CACHE_HOME/tpu-agent/<kind>`` (``~/.cache``)."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]) / kind
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpu-agent" / kind


def not_private(directory: Path, *, up_to: Path) -> str | None:
    """Why ``directory`` (and each folder above it up to ``up_to``) is not this user's alone, None when it is: a
    symlink, another owner, or writable by group or others. A cache whose entries are loaded and run (compiled
    executables) must not live where another user of the host can plant or swap one (``/dev/shm`` is shared)."""
    for folder in [directory, *[parent for parent in directory.parents if parent.is_relative_to(up_to)]]:
        try:
            info = os.lstat(folder)
        except OSError as error:
            return f"{folder}: {error.strerror}"
        if stat.S_ISLNK(info.st_mode):
            return f"{folder} is a symlink"
        if info.st_uid != os.getuid():
            return f"{folder} belongs to another user (uid {info.st_uid})"
        if info.st_mode & 0o022:
            return f"{folder} is writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


# The temporary file a write goes through is named "<TEMP_PREFIX><target name>.<random>" + TEMP_SUFFIX, next to
# the target. Exported so that a later run can recognise (and clean) one a killed write left behind.
TEMP_PREFIX = "."
TEMP_SUFFIX = ".tpu-agent-tmp"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, keeping the existing file's mode (or 0o644 for a new file).

    A symlink at ``path`` is written through to its target so the link itself survives; callers that must
    not follow links out of a tree check that before calling (see ``tpu_agent.migrate``).
    """

    def write(handle: BinaryIO, _name: str) -> None:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())

    _replace_atomically(path, write)


def atomic_write_with(path: Path, write: Callable[[str], object]) -> None:
    """Replace ``path`` atomically with what ``write`` puts into the temporary file name it is given.

    For writers that insist on a file name (torch's Kineto trace export). The data is not fsynced: this is for
    files a reader must never see half-written, not for user files that must survive a power cut.
    """
    _replace_atomically(path, lambda _handle, name: write(name))


def _replace_atomically(path: Path, write: Callable[[BinaryIO, str], object]) -> None:
    """``write`` fills the temporary file (given open, and by name) that then replaces ``path``."""
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp_name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle, tmp_name)
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def not_regular(mode: int) -> str | None:
    """What a non-regular file is (``"a FIFO"``...), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), "not a regular file")


def read_regular(path: Path, *, limit: int | None = None, follow_symlinks: bool = False) -> bytes:
    """The bytes of ``path`` if it is a regular file (of at most ``limit`` bytes), else :class:`OSError` with a
    readable ``strerror``.

    For files someone else chose (a tree to migrate, a capture's records, the sources its call sites name): a
    FIFO would block the reader forever and ``/dev/zero`` never ends, so the file is opened without blocking
    (and, unless ``follow_symlinks``, without following a link) and checked with ``fstat`` on the open
    descriptor before anything is read.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        kind = not_regular(os.fstat(fd).st_mode)
        if kind is not None:
            raise OSError(errno.EINVAL, f"{kind}, not a regular file")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                raise OSError(errno.EFBIG, f"larger than the {limit} bytes tpu-agent reads from such a file")
        return b"".join(chunks)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str, encoding: str = "utf-8", newline: str | None = None) -> None:
    """Text flavour of :func:`atomic_write_bytes`.

    ``newline`` is the line ending to write (``"\\r\\n"`` keeps a CRLF file CRLF); ``None`` writes ``text``
    exactly as given, which is what the codemod wants because it already preserved the file's endings.
    """
    if newline is not None:
        text = text.replace("\r\n", "\n").replace("\n", newline)
    atomic_write_bytes(path, text.encode(encoding))
