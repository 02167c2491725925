"""`vyre_async._cache.files`: the file-system rules the disk caches share (issue 28).

These are the pieces a store (the pipeline cache, the calibration store, a
backend's own) builds on, so their contracts are tested as such: the names of
temp files and what matches them, the modes of what is created, what is
deleted, which processes count as alive, and the errors raised.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from vyre_async._cache.files import (
    STALE_TEMP_SECONDS,
    NotRegularFile,
    create_temp,
    file_kind,
    make_private_dirs,
    open_regular,
    read_prefix,
    temp_is_stale,
    temp_name_pattern,
    unlink_unchanged,
    writer_alive,
)

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file types, modes, signals")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: no process has this id now (barring reuse within moments)
    return proc.pid


# file_kind and open_regular ---------------------------------------------------------

KINDS = [
    (stat.S_IFLNK | 0o777, "symbolic link"),
    (stat.S_IFIFO | 0o644, "FIFO"),
    (stat.S_IFCHR | 0o666, "character device"),
    (stat.S_IFBLK | 0o660, "block device"),
    (stat.S_IFSOCK | 0o755, "socket"),
    (stat.S_IFDIR | 0o700, "directory"),
    (0o644, "special file"),  # no file type bits
]


@pytest.mark.parametrize(("mode", "name"), KINDS, ids=[k[1] for k in KINDS])
def test_file_kind_names_each_type(mode: int, name: str) -> None:
    assert file_kind(mode) == name


@posix_only
def test_open_regular_names_what_is_there_instead(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    expected = {
        "dir": f"{tmp_path / 'dir'} is a directory, not a regular file",
        "fifo": f"{tmp_path / 'fifo'} is a FIFO, not a regular file",
        "link": f"{tmp_path / 'link'} is a symbolic link",
    }
    if os.path.exists("/dev/null"):
        expected["/dev/null"] = "/dev/null is a character device, not a regular file"
    for name, message in expected.items():
        with pytest.raises(NotRegularFile) as raised:
            open_regular(tmp_path / name)
        assert str(raised.value) == message


# read_prefix ----------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="needs Unix datagram sockets")
@pytest.mark.parametrize(
    ("chunks", "size", "expected"),
    [
        ([b"abc", b"def", b"ghij"], 8, b"abcdefgh"),
        ([b"abc", b"def", b"gh"], 8, b"abcdefgh"),
        ([b"a", b"b", b"c", b"d"], 3, b"abc"),
        ([b"abcdefghij"], 4, b"abcd"),
    ],
)
def test_read_prefix_collects_short_reads_up_to_exactly_size(
    chunks: list[bytes], size: int, expected: bytes
) -> None:
    """A descriptor that returns less than asked (each datagram is one read)."""
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with reader, writer:
        reader.setblocking(False)  # a read past what was sent fails instead of hanging
        for chunk in chunks:
            writer.send(chunk)
        assert read_prefix(reader.fileno(), size) == expected


def test_read_prefix_stops_at_the_end_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_prefix(fd, 10) == b"abc"
        assert read_prefix(fd, 10) == b""
    finally:
        os.close(fd)


# make_private_dirs ----------------------------------------------------------------------


@posix_only
@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask022", "umask002"])
def test_directories_are_private_from_creation_even_where_chmod_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask: int
) -> None:
    """A file system that refuses chmod: the mode given to mkdir is all there is."""

    def no_chmod(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", no_chmod)
    old = os.umask(umask)
    try:
        make_private_dirs(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    for created in ("a", "a/b"):
        assert stat.S_IMODE((tmp_path / created).stat().st_mode) == 0o700


@posix_only
def test_a_directory_made_meanwhile_by_another_process_is_kept_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.mkdir
    raced = tmp_path / "a"

    def mkdir(path: Any, mode: int = 0o777, **kwargs: Any) -> None:
        if Path(path) == raced and not raced.exists():
            real(raced)  # another writer got there first, with its own mode
            os.chmod(raced, 0o755)
        real(path, mode, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    make_private_dirs(tmp_path / "a" / "b" / "c")
    assert stat.S_IMODE(raced.stat().st_mode) == 0o755
    for created in ("a/b", "a/b/c"):
        assert stat.S_IMODE((tmp_path / created).stat().st_mode) == 0o700


def test_a_file_in_the_way_is_not_a_directory(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    target.write_bytes(b"a file")
    with pytest.raises(NotADirectoryError) as raised:
        make_private_dirs(target)
    error = raised.value
    assert (error.errno, error.strerror, error.filename) == (
        errno.ENOTDIR,
        "not a directory",
        str(target),
    )
    assert target.read_bytes() == b"a file"


# create_temp and temp_name_pattern ------------------------------------------------------


@posix_only
def test_create_temp_makes_a_new_0600_file_named_for_this_process(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        fd, path = create_temp(tmp_path, ".entry")
    finally:
        os.umask(old)
    os.close(fd)
    assert path.parent == tmp_path
    match = temp_name_pattern(r"\.entry").fullmatch(path.name)
    assert match is not None and match["pid"] == str(os.getpid())
    assert re.fullmatch(rf"\.entry\.{os.getpid()}\.[0-9a-f]{{16}}\.tmp", path.name)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b""


@pytest.mark.parametrize(("taken", "created"), [(0, True), (7, True), (8, False)])
def test_create_temp_tries_eight_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: int, created: bool
) -> None:
    """Random names that collide (here: a predictable "random" source) are skipped 8 times."""
    tags = [bytes([i]) * 8 for i in range(16)]
    for tag in tags[:taken]:
        (tmp_path / f".p.{os.getpid()}.{tag.hex()}.tmp").write_bytes(b"someone else's")
    draws = iter(tags)
    monkeypatch.setattr(os, "urandom", lambda n: next(draws))
    if created:
        fd, path = create_temp(tmp_path, ".p")
        os.close(fd)
        assert path.name == f".p.{os.getpid()}.{tags[taken].hex()}.tmp"
        assert path.read_bytes() == b""
    else:
        with pytest.raises(FileExistsError) as raised:
            create_temp(tmp_path, ".p")
        error = raised.value
        assert (error.errno, error.strerror, error.filename) == (
            errno.EEXIST,
            "no free temp file name",
            str(tmp_path),
        )
    assert len(list(tmp_path.iterdir())) == taken + created
    for tag in tags[:taken]:  # the names already taken are left as they were
        assert (tmp_path / f".p.{os.getpid()}.{tag.hex()}.tmp").read_bytes() == b"someone else's"


NAMES = [
    (".abc.1.0123456789abcdef.tmp", "1"),
    (".abc.4294967295.0123456789abcdef.tmp", "4294967295"),
    (".abc.9999999999.0123456789abcdef.tmp", "9999999999"),
    (".abc.12345678901.0123456789abcdef.tmp", None),  # 11 digits
    (".abc.0.0123456789abcdef.tmp", None),
    (".abc.01.0123456789abcdef.tmp", None),
    (".abc.1.0123456789ABCDEF.tmp", None),
    (".abc.1.0123456789abcdef.TMP", None),
    (".abc.1.0123456789abcde.tmp", None),  # 15 hex
    (".abc.1.0123456789abcdef0.tmp", None),  # 17 hex
    (".abcX1.0123456789abcdef.tmp", None),
    (".abc.1X0123456789abcdef.tmp", None),
    (".abc.1.0123456789abcdefXtmp", None),
    ("x.abc.1.0123456789abcdef.tmp", None),
    (".abc.1.0123456789abcdef.tmp~", None),
]


@pytest.mark.parametrize(("name", "pid"), NAMES, ids=[n[0] for n in NAMES])
def test_temp_name_pattern(name: str, pid: str | None) -> None:
    match = temp_name_pattern(r"\.abc").fullmatch(name)
    assert (match and match["pid"]) == pid


# temp_is_stale and writer_alive ---------------------------------------------------------


@pytest.mark.parametrize(
    ("age", "stale"),
    [
        (0.0, False),
        (STALE_TEMP_SECONDS - 1, False),
        (STALE_TEMP_SECONDS, False),
        (STALE_TEMP_SECONDS + 1, True),
    ],
)
def test_a_live_writers_temp_is_stale_only_past_the_age_limit(age: float, stale: bool) -> None:
    assert STALE_TEMP_SECONDS == 3600.0
    assert temp_is_stale(os.getpid(), 1000.0, now=1000.0 + age) is stale


def test_temp_is_stale_reads_the_clock_when_not_given_one() -> None:
    assert temp_is_stale(os.getpid(), time.time()) is False
    assert temp_is_stale(os.getpid(), time.time() - STALE_TEMP_SECONDS - 60) is True
    assert temp_is_stale(_dead_pid(), time.time()) is True


def test_temp_is_stale_uses_the_time_it_is_given() -> None:
    assert temp_is_stale(os.getpid(), 0.0, now=10.0) is False
    assert temp_is_stale(os.getpid(), 1e12, now=1e12 + STALE_TEMP_SECONDS + 1) is True


@posix_only
def test_writer_alive_on_posix(monkeypatch: pytest.MonkeyPatch) -> None:
    assert writer_alive(os.getpid()) is True
    assert writer_alive(_dead_pid()) is False
    assert writer_alive(9_999_999_999) is False  # beyond any pid: OverflowError
    assert writer_alive(2**64) is False

    def not_permitted(pid: int, sig: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "kill", not_permitted)  # a process of another user
    assert writer_alive(_dead_pid()) is True


def test_writer_alive_on_windows_is_never_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = _dead_pid()
    probes: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: probes.append((pid, sig)))
    with monkeypatch.context() as m:
        m.setattr(sys, "platform", "win32")
        assert writer_alive(dead) is True
    assert probes == []  # os.kill would end the process there


PROBED = textwrap.dedent(
    """
    import signal, sys
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    print("ready", flush=True)
    sys.stdin.read()
    print(sorted(int(s) for s in signal.sigpending()), flush=True)
    """
)


@posix_only
def test_probing_a_writer_sends_it_no_signal() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBED],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == "ready\n"  # every signal blocked: pending ones show
        assert writer_alive(proc.pid) is True
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert out.strip() == "[]"


# unlink_unchanged -----------------------------------------------------------------------


def test_unlink_unchanged_deletes_only_the_file_that_was_checked(tmp_path: Path) -> None:
    path = tmp_path / "entry"
    path.write_bytes(b"checked")
    checked = os.stat(path)
    replacement = tmp_path / "new"
    replacement.write_bytes(b"written since")
    os.replace(replacement, path)  # another writer replaced it after the check
    assert unlink_unchanged(path, checked) is False
    assert path.read_bytes() == b"written since"

    assert unlink_unchanged(path, os.stat(path)) is True
    assert not path.exists()
    assert unlink_unchanged(path, checked) is False  # nothing there any more
