"""Routing memory, the writing side (routing.md §6.5): the block recorded after a turn,
where it goes (``<wd>/.xworkmate/memory.md``, else the project-home file), and the append:
one ``O_APPEND`` write under an exclusive lock, never through a symlink nor into anything
but a regular file, rotated to ``<file>.1`` above ``memory_max_bytes`` with the rotated
file's preferences carried over. Blocking; the async callers run it in a thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from datetime import datetime
from pathlib import Path

from xwm_bridge.beneath import FILE_FLAGS, open_dir
from xwm_bridge.flock import lock_until
from xwm_bridge.router.memory import (
    READ_CAP_FACTOR,
    MemoryLocations,
    parse,
    regular_tail,
    sanitize,
)

#: how long an append waits for the file's lock (another writer: a bridge, an editor)
LOCK_TIMEOUT = 10.0
#: project-home files (``<memory_home>/self-improving/projects/<name>.md``, one per name a
#: client's working directory ends in) past which no new one is made
MAX_PROJECT_FILES = 4096


def render_block(
    route: str, model: str, skills: tuple[str, ...], provider: str, now: datetime | None = None
) -> str:
    """§6.5 block: leading blank line, heading, then the non-empty preferences."""
    stamp = (now or datetime.now().astimezone()).isoformat(timespec="seconds")
    if stamp.endswith("+00:00"):  # RFC 3339 as Go writes it (examples.md §5): UTC is Z
        stamp = stamp[: -len("+00:00")] + "Z"
    # preferred-route always (§6.5), even when empty
    return _block(f"Auto route {stamp}", [f"preferred-route: {route}"], model, skills, provider)


def _block(
    heading: str, lines: list[str], model: str, skills: tuple[str, ...], provider: str
) -> str:
    """A block: a blank line, ``## heading``, ``lines``, then the non-empty preferences,
    each on one line."""
    lines = ["", f"## {heading}", *lines]
    if model:
        lines.append(f"preferred-model: {model}")
    if skills:
        lines.append(f"preferred-skills: {', '.join(skills)}")
    if provider:
        lines.append(f"provider: {provider}")
    return "\n".join(_one_line(v) for v in lines) + "\n"


#: every character str.splitlines() (parse) breaks a line at, not only \r and \n
_LINE_BREAKS = dict.fromkeys(map(ord, "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"), " ")


def _one_line(value: str) -> str:
    # client-chosen values (model, skills) must not inject extra preference lines
    return value.translate(_LINE_BREAKS)


def record_target(locations: MemoryLocations) -> Path | None:
    """§6.5: the project-local file when allowed, else the project-home file."""
    if locations.project_local_dir is not None:
        return locations.project_local_dir / "memory.md"
    return home_target(locations)


def home_target(locations: MemoryLocations) -> Path | None:
    """The project-home file, ``<memory_home>/self-improving/projects/<project>.md``:
    also where a block goes when ``<wd>/.xworkmate`` cannot be made (§6.5)."""
    if locations.memory_dir is not None and locations.project:
        return locations.memory_dir / "projects" / f"{locations.project}.md"
    return None


class FolderError(OSError):
    """The folder of the memory file could not be made or opened (a file or a symlink
    in its place, a read-only working directory): nothing was written."""


def append(
    path: Path,
    block: str,
    max_bytes: int,
    anchor: tuple[Path, tuple[str, ...]] | None = None,
    max_files: int = 0,
) -> None:
    """Append ``block`` in one write under an exclusive lock; rotate above ``max_bytes``.

    ``max_files``: when the file does not exist yet, its folder may hold at most that
    many ``.md`` files before it (0: no bound); past it, OSError and nothing is made.

    ``anchor``: (trusted directory, components below it), as
    :meth:`MemoryLocations.anchor` gives; default: ``path``'s grandparent, so the
    directory holding the file is not followed. Everything below the trusted one is
    made and opened relative to its parent's fd with ``O_NOFOLLOW``: a check of
    ``.xworkmate`` and then an open of ``.xworkmate/memory.md`` by path let a writer
    inside the working directory swap it for a symlink in between, and the block
    went to a ``memory.md`` outside the roots."""
    base, parts = anchor if anchor is not None else (path.parent.parent, path.parts[-2:])
    try:
        base.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        raise FolderError(f"cannot make {base}: {exc.strerror or exc}") from None
    data = block.encode("utf-8")
    # O_NONBLOCK: opening a FIFO for writing would wait for a reader (for ever, holding
    # the turn's reply and a worker thread); it fails with ENXIO instead, and a FIFO
    # that has a reader, or a device, is refused below
    flags = (
        os.O_WRONLY
        | os.O_APPEND
        | os.O_CREAT
        | os.O_NOFOLLOW
        | os.O_NONBLOCK
        | getattr(os, "O_CLOEXEC", 0)
    )
    # a bounded wait: a stuck holder (another process, a hung NFS server) kept the
    # turn's reply and a worker thread waiting for ever
    deadline = time.monotonic() + LOCK_TIMEOUT
    busy = f"{path} is locked by another writer (waited {LOCK_TIMEOUT:g} s)"
    name = parts[-1]
    try:
        folder = open_dir(base, parts[:-1], create=True, mode=0o755)  # §6.5: 0755
    except OSError as exc:  # ELOOP/ENOTDIR: a symlink (or a file) on the way
        raise FolderError(f"refusing to write through {path.parent}: {exc.strerror}") from None
    try:
        if max_files > 0:
            _check_room(folder, name, max_files, path.parent)
        fd = _locked_current(folder, name, flags, deadline, busy)
        try:
            if max_bytes > 0 and os.fstat(fd).st_size + len(data) > max_bytes:
                # rotate under the lock: a writer waiting on the old file sees, once it
                # has the lock, that it is no longer the one of that name and reopens
                os.replace(name, name + ".1", src_dir_fd=folder, dst_dir_fd=folder)
                fresh = _locked_current(folder, name, flags, deadline, busy)
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                fd = fresh
                carried = _carried(folder, name + ".1", max_bytes)
                if len(carried) + len(data) <= max_bytes:
                    data = carried + data
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    finally:
        os.close(folder)


def _check_room(folder: int, name: str, max_files: int, where: Path) -> None:
    """OSError when ``name`` is not in ``folder`` and the folder has ``max_files`` of
    its kind (``.md``) already: client-chosen names must not make files without bound."""
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
        return  # there already: it takes the block
    except FileNotFoundError:
        pass
    count = sum(1 for entry in os.listdir(folder) if entry.endswith(".md"))
    if count >= max_files:
        raise OSError(f"{where} holds {count} memory files already: no new one is made")


def _carried(folder: int, rotated: str, max_bytes: int) -> bytes:
    """What the file rotated to ``rotated`` said (its parsed preferences, no prose, no
    secret lines), as the first block of the fresh file: ``<file>.1`` is read by nothing,
    and the preferences written by hand at its top stopped applying at the rotation."""
    try:
        fd = os.open(rotated, FILE_FLAGS, dir_fd=folder)
        text = regular_tail(fd, max_bytes * READ_CAP_FACTOR)
    except OSError:
        return b""
    part = parse(sanitize(text))
    if not (part.route or part.model or part.skills or part.provider):
        return b""
    route = [f"preferred-route: {part.route}"] if part.route else []
    heading = f"Carried over from {rotated}"
    return _block(heading, route, part.model, tuple(part.skills), part.provider).encode()


def _locked_current(folder: int, name: str, flags: int, deadline: float, busy: str) -> int:
    """``name`` in ``folder`` opened and locked, and still the file of that name once
    locked: a writer that opened it before another rotated it (it waited for the lock
    meanwhile) wrote its block into ``<file>.1``, which nothing reads, and the turn's
    record was lost."""
    while True:
        fd = _open_regular(folder, name, flags)
        try:
            lock_until(fd, deadline, busy)
            held = os.fstat(fd)
            try:
                now = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                now = None  # rotated, the fresh file not made yet: make it
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # (its lock with it) and open the file now of that name


def _open_regular(folder: int, name: str, flags: int) -> int:
    fd = os.open(name, flags, 0o644, dir_fd=folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"refusing to append to a non-regular file: {name}")
    return fd
