"""Files opened beneath a directory without following a symlink on the way.

A path checked, then opened, can change in between: a writer inside an allowed
root (an agent in its working directory) may swap a directory for a symlink out
of the root. Opening each component relative to the one before with
``O_NOFOLLOW`` closes that window: a component that is a symlink makes the open
fail (``ELOOP`` or ``ENOTDIR``) instead of leading elsewhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
#: ``O_NONBLOCK``: a FIFO opens at once (and is then refused by an ``fstat`` check)
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def parent_fd(base: Path, parts: tuple[str, ...]) -> Iterator[int]:
    """A directory fd of ``base/parts[:-1]`` (:func:`open_dir`), closed on exit."""
    fd = open_dir(base, parts[:-1])
    try:
        yield fd
    finally:
        os.close(fd)


def open_dir(
    base: Path | str, parts: tuple[str, ...], *, create: bool = False, mode: int = 0o777
) -> int:
    """A directory fd of ``base/parts``, every component opened ``O_NOFOLLOW`` relative
    to the one before (``base`` itself is followed: it is trusted), and with ``create``
    made when missing (with ``mode``, less the umask; a symlink on the way still fails);
    the caller closes it."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # made meanwhile: opened below
                    os.mkdir(part, mode, dir_fd=fd)
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(path: Path) -> int:
    """An fd of the absolute ``path`` read-only, no component of it a symlink."""
    parts = path.parts[1:]
    if not parts:  # "/" itself
        raise IsADirectoryError(21, "Is a directory", str(path))
    with parent_fd(Path(path.anchor), parts) as parent:
        return os.open(parts[-1], FILE_FLAGS, dir_fd=parent)
