"""Confined, atomic file replacement for mount configs.

Every call takes an optional ``dir_fd``: the file's directory opened beneath the tool
home without following a symlink (:func:`xwm_bridge.beneath.open_dir`); the file, its
lock, temp file and ``.bak`` are then named in it, never by a path again (a directory
swapped for a symlink out of the home after the check cannot lead outside).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import tempfile
import threading
import time
from pathlib import Path

from xwm_bridge.flock import lock_until

#: per-file thread locks with the number of holders and waiters; an entry is dropped
#: when the last one leaves (the paths are client-chosen: kept forever, they grew)
_LOCKS: dict[str, tuple[threading.Lock, int]] = {}
_LOCKS_GUARD = threading.Lock()
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: how long :class:`Locked` waits for a file's lock (thread lock and ``flock`` together)
LOCK_TIMEOUT = 10.0


def inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def real(path: str) -> Path:
    return Path(os.path.realpath(os.path.expanduser(path)))


def _thread_lock(path: Path) -> threading.Lock:
    with _LOCKS_GUARD:
        lock, users = _LOCKS.get(str(path), (threading.Lock(), 0))
        _LOCKS[str(path)] = (lock, users + 1)
        return lock


def _thread_unlock(path: Path, lock: threading.Lock) -> None:
    with _LOCKS_GUARD:
        lock.release()
        users = _LOCKS[str(path)][1] - 1
        if users:
            _LOCKS[str(path)] = (lock, users)
        else:
            del _LOCKS[str(path)]


def _thread_forget(path: Path) -> None:
    """A waiter that gave up without the lock leaves (the lock is not its to release)."""
    with _LOCKS_GUARD:
        lock, users = _LOCKS[str(path)]
        if users > 1:
            _LOCKS[str(path)] = (lock, users - 1)
        else:
            del _LOCKS[str(path)]


def _busy(lock_path: Path) -> str:
    return f"{lock_path} is held by another writer (waited {LOCK_TIMEOUT:g} s)"


def _at(path: Path, dir_fd: int | None) -> Path | str:
    """What an ``os`` call takes for ``path``: its name in ``dir_fd`` (the directory
    opened beneath the tool home, :func:`xwm_bridge.beneath.open_dir`), else the path."""
    return path if dir_fd is None else path.name


def read_text(path: Path, dir_fd: int | None = None) -> str:
    """The file's text, ``""`` if missing; refuses symlinks, anything but a regular file
    and oversized files. With ``dir_fd``: ``path``'s name in that directory."""
    # O_NONBLOCK: a FIFO named like a managed file opens at once instead of waiting for
    # a writer (for ever, holding the reconcile and its worker thread); fstat refuses it
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(_at(path, dir_fd), flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return ""
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise OSError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    return data.decode("utf-8")


def exists(path: Path, dir_fd: int | None = None) -> bool:
    """Something is at ``path`` (a symlink itself counts; see :func:`_at`)."""
    try:
        os.stat(_at(path, dir_fd), dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


class Locked:
    """Serializes edits of one file across threads and processes, waiting at most
    :data:`LOCK_TIMEOUT` seconds (then :class:`TimeoutError`, an ``OSError``); the lock
    file beside it in ``dir_fd`` when given (see :func:`_at`)."""

    def __init__(self, path: Path, dir_fd: int | None = None) -> None:
        self._path = path
        self._dir_fd = dir_fd
        self._thread: threading.Lock | None = None
        self._fd = -1

    def __enter__(self) -> Locked:
        deadline = time.monotonic() + LOCK_TIMEOUT
        lock_path = self._path.with_name(f".{self._path.name}.xworkmate.lock")
        thread = _thread_lock(self._path)
        try:
            if not thread.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise TimeoutError(_busy(lock_path))
        except BaseException:
            _thread_forget(self._path)
            raise
        self._thread = thread
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            at = _at(lock_path, self._dir_fd)
            self._fd = os.open(at, flags, 0o600, dir_fd=self._dir_fd)
            lock_until(self._fd, deadline, _busy(lock_path))
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            _thread_unlock(self._path, self._thread)
            self._thread = None
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        if self._thread is not None:
            _thread_unlock(self._path, self._thread)
            self._thread = None


def replace(path: Path, text: str, previous: str | None, dir_fd: int | None = None) -> None:
    """Write ``text`` atomically (temp file + rename), keeping the mode; back up
    ``previous``. With ``dir_fd`` all of it happens in that directory (:func:`_at`)."""
    try:
        mode = stat.S_IMODE(
            os.stat(_at(path, dir_fd), dir_fd=dir_fd, follow_symlinks=False).st_mode
        )
    except FileNotFoundError:
        mode = 0o644
    if previous is not None:
        _write_new(path.with_name(path.name + ".bak"), previous, mode, dir_fd)
    _write_new(path, text, mode, dir_fd)


def _write_new(path: Path, text: str, mode: int, dir_fd: int | None) -> None:
    if dir_fd is None:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        at: Path | str = path
    else:  # mkstemp takes no dir_fd: the same O_EXCL create, by name in the directory
        tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd, at = os.open(tmp, flags, 0o600, dir_fd=dir_fd), path.name
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8"))
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, at, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
