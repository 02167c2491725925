"""Files a cache owns: the file-system rules the on-disk stores share.

A cache directory may hold files the cache did not write (``$VYRE_CACHE_DIR``
can point anywhere), so a store recognises its own files by name and content
and touches nothing else. These functions are the pieces every such store
needs:

- `open_regular` opens a file for reading only if it is a regular file: it
  never follows a symlink at the path and never waits on a FIFO (it raises
  `NotRegularFile` for either, and for a device, socket or directory);
  `read_prefix` reads the first bytes of it to check whose it is.
- `make_private_dirs` creates the directories a store needs, each with mode
  0700, and leaves the mode of a directory that already exists alone.
- `create_temp` creates a writer's temp file, named with the writer's process
  id (``<prefix>.<pid>.<16 hex>.tmp``, matched by `temp_name_pattern`), so that
  `temp_is_stale` can tell when its writer was killed before renaming it:
  the writer no longer exists (`writer_alive`), or the file is older than
  `STALE_TEMP_SECONDS`.
- `unlink_unchanged` deletes a file only if it is still the one that was checked.
- `non_regular_occupant` says what non-regular file blocks a path an entry is
  about to be renamed onto.
- `root_directory` turns a store's ``root`` argument into its directory (or
  the store's default), refusing anything that is not a path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidArgument

__all__ = [
    "STALE_TEMP_SECONDS",
    "NotRegularFile",
    "create_temp",
    "file_kind",
    "make_private_dirs",
    "non_regular_occupant",
    "open_regular",
    "read_prefix",
    "root_directory",
    "temp_is_stale",
    "temp_name_pattern",
    "unlink_unchanged",
    "writer_alive",
]
__dir__ = _public_dir(__name__)

STALE_TEMP_SECONDS = 3600.0
"""A temp file older than this (seconds since its last write) is reclaimed whoever wrote it."""

_O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_O_BINARY: int = getattr(os, "O_BINARY", 0)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _O_NOFOLLOW | _O_BINARY
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_BINARY
_PID = r"(?P<pid>[1-9][0-9]{0,9})"


class NotRegularFile(OSError):
    """Something other than a regular file (a symlink, FIFO, device...) is at a path."""


def file_kind(mode: int) -> str:
    """Return a readable name for the type of file ``mode`` (an ``st_mode``) describes.

    Returns:
        ``"symbolic link"``, ``"FIFO"``, ``"character device"``, ``"block
        device"``, ``"socket"``, ``"directory"``, else ``"special file"`` (a
        regular file is not expected here).
    """
    for test, name in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return name
    return "special file"


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading as a regular file, never following a symlink or waiting on a FIFO.

    The file is opened with ``O_NONBLOCK | O_NOFOLLOW`` (where the platform has
    them) and checked with ``fstat``, so what was checked is what is read.

    Returns:
        The open file descriptor (the caller closes it) and its ``fstat``.

    Raises:
        NotRegularFile: A symlink, FIFO, device, socket or directory is there.
        OSError: It could not be opened (`FileNotFoundError` when nothing is there).
    """
    if not _O_NOFOLLOW and os.path.islink(path):
        raise NotRegularFile(f"{os.fspath(path)} is a symbolic link")
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        if os.path.islink(path):  # ELOOP (EMLINK on some BSDs) from O_NOFOLLOW
            raise NotRegularFile(f"{os.fspath(path)} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(
                f"{os.fspath(path)} is a {file_kind(st.st_mode)}, not a regular file"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_prefix(fd: int, size: int) -> bytes:
    """Return the next ``size`` bytes of ``fd``, fewer only at the end of the file.

    Raises:
        OSError: The read failed.
    """
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def make_private_dirs(directory: str | os.PathLike[str]) -> None:
    """Create ``directory`` and its missing parents, one level at a time, each with mode 0700.

    Directories that already exist are left as they are, mode included (a
    shared 1777 directory keeps its sticky and world bits). A directory another
    process creates meanwhile is left as that process made it. On Windows the
    mode is not applied.

    Raises:
        NotADirectoryError: A file that is not a directory is in the way.
        OSError: A directory could not be created (e.g. `PermissionError`).
    """
    target = Path(directory)
    missing: list[Path] = []
    current = target
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for created in reversed(missing):
        try:
            os.mkdir(created, 0o700)
        except FileExistsError:
            continue  # made meanwhile by another writer (or not a directory: reported below)
        if sys.platform != "win32":
            with contextlib.suppress(OSError):
                os.chmod(created, 0o700)  # mkdir's mode went through the umask
    if not target.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(target))


def writer_alive(pid: int) -> bool:
    """Return whether process ``pid`` may still be writing (True when it cannot be told).

    On POSIX this is ``os.kill(pid, 0)``: a process of another user counts as
    alive, a process in another pid namespace looks dead. On Windows nothing is
    probed (``os.kill`` would end the process) and the answer is always True.
    """
    if sys.platform == "win32":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OverflowError:
        return False  # no process can have that id
    except OSError:
        return True  # PermissionError: it exists, owned by another user
    return True


def temp_name_pattern(prefix: str) -> re.Pattern[str]:
    """Return the pattern of the names `create_temp` gives temp files.

    Args:
        prefix: A regular expression matching the ``prefix`` passed to
            `create_temp` (escape literal dots); it must not define a group
            named ``pid``.

    Returns:
        A pattern for ``<prefix>.<pid>.<16 hex>.tmp`` (use ``fullmatch``) whose
        group ``pid`` is the writer's process id.
    """
    return re.compile(prefix + r"\." + _PID + r"\.[0-9a-f]{16}\.tmp")


def create_temp(directory: str | os.PathLike[str], prefix: str) -> tuple[int, Path]:
    """Create this process's new temp file ``<prefix>.<pid>.<16 hex>.tmp`` in ``directory``.

    The file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600:
    it is always a new regular file, never something already at that name.

    Returns:
        The descriptor, open for writing (the caller closes it), and the path.

    Raises:
        OSError: It could not be created.
    """
    for _ in range(8):
        tmp = Path(directory) / f"{prefix}.{os.getpid()}.{os.urandom(8).hex()}.tmp"
        try:
            return os.open(tmp, _TEMP_FLAGS, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temp file name", str(directory))


def temp_is_stale(pid: int, mtime: float, *, now: float | None = None) -> bool:
    """Return whether a temp file of writer ``pid``, last written at ``mtime``, may be reclaimed.

    It may when it is older than `STALE_TEMP_SECONDS` (whoever wrote it: a
    reused pid, another host on a shared file system) or when `writer_alive`
    says its writer no longer exists.

    Args:
        pid: The writer's process id, from the temp file's name.
        mtime: The temp file's modification time (Unix seconds).
        now: The current time; ``time.time()`` when None.
    """
    current = time.time() if now is None else now
    return current - mtime > STALE_TEMP_SECONDS or not writer_alive(pid)


def unlink_unchanged(path: str | os.PathLike[str], checked: os.stat_result) -> bool:
    """Delete ``path`` if it is still the file ``checked`` describes; return whether it was deleted.

    The file at ``path`` must have the device and inode of ``checked`` (the
    ``fstat`` of the file whose content was checked): a file put there since,
    or a symlink, is left alone. Errors are swallowed (the result is False).
    """
    try:
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino):
            return False  # replaced since it was checked
        os.unlink(path)
    except OSError:
        return False
    return True


def non_regular_occupant(path: str | os.PathLike[str]) -> str | None:
    """Return the kind of the non-regular file at ``path`` (not following a symlink), else None.

    None means nothing is there or a regular file is.

    Raises:
        OSError: ``path`` could not be examined (other than not existing).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)


def root_directory(root: object, default: Callable[[], Path], what: str) -> Path:
    """Return a cache's root directory: ``root`` (a path, ``~`` expanded), else ``default()``.

    Raises:
        InvalidArgument: ``root`` is neither None, a string nor a path-like object, or
            is a path no file system accepts (a NUL character, an empty string).
    """
    if root is None:
        return default()
    if not isinstance(root, str | os.PathLike):
        raise InvalidArgument(
            f"{what} root must be a directory path (str or os.PathLike), got {root!r}",
            fix=f'pass a path, e.g. {what}("~/.cache/vyre"), or None for the default',
        )
    text = os.fspath(root)
    why = ""
    if isinstance(text, str) and text:
        if "\0" in text:
            why = " (it holds a NUL character)"
        else:
            try:
                os.fsencode(text)
            except UnicodeError:
                why = " (it has no file system name: a lone surrogate)"
            else:
                return Path(text).expanduser()
    raise InvalidArgument(
        f"{what} root {root!r} is not a usable directory path{why}",
        fix=f'pass a path, e.g. {what}("~/.cache/vyre"), or None for the default',
    )
