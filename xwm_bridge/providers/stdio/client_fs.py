"""``fs/read_text_file`` and ``fs/write_text_file`` served to agents, confined.

A path is served only when the session's working directory lies under one of
the configured ``allowed_roots`` and the path (after resolving symlinks) lies
inside that working directory. No allowed roots → nothing is served. A write
replaces the file atomically (temp file + rename) and keeps its permission bits.

The checked path is then opened component by component from the session
directory, never through a symlink (:mod:`xwm_bridge.beneath`): a directory the
agent swaps for a symlink out of the root between the check and the use makes
the read or write fail instead of leading outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from xwm_bridge import beneath
from xwm_bridge.providers.stdio import codec
from xwm_bridge.providers.stdio.agent import ClientError

NOT_FOUND = "Resource not found"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def confined_root(cwd: str, allowed_roots: tuple[str, ...]) -> str | None:
    """The resolved session directory when it lies under an allowed root, else None."""
    if not cwd or not os.path.isabs(cwd):
        return None
    real = os.path.realpath(cwd)
    for root in allowed_roots:
        if _inside(real, os.path.realpath(root)):
            return real
    return None


def resolve(path: Any, root: str | None) -> str:
    if root is None:
        raise ClientError(
            codec.INVALID_PARAMS, "file access is not allowed for this session's directory"
        )
    if not isinstance(path, str) or not os.path.isabs(path):
        raise ClientError(codec.INVALID_PARAMS, "path must be an absolute path")
    if "\0" in path:  # no file has one, and the OS calls raise on it
        raise ClientError(codec.INVALID_PARAMS, "path must not contain a NUL character")
    real = os.path.realpath(path)
    if not _inside(real, root):
        raise ClientError(codec.INVALID_PARAMS, "path is outside the session's working directory")
    return real


def parts_below(path: str, root: str) -> tuple[str, ...]:
    """``path`` (checked: inside ``root``) as components below ``root``."""
    rel = os.path.relpath(path, root)
    return () if rel == os.curdir else tuple(rel.split(os.sep))


def _read(path: str, root: str, max_bytes: int, line: Any, limit: Any) -> str:
    parts = parts_below(path, root)
    if not parts:
        raise ClientError(codec.INVALID_PARAMS, "not a regular file")
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (a worker thread stuck
        # there forever, and the daemon with it at exit); only regular files are read.
        # O_NOFOLLOW on every component: no symlink swapped in since the check is used
        with beneath.parent_fd(Path(root), parts) as parent:
            fd = os.open(parts[-1], beneath.FILE_FLAGS, dir_fd=parent)
    except (FileNotFoundError, NotADirectoryError):
        raise ClientError(codec.RESOURCE_NOT_FOUND, NOT_FOUND) from None
    except OSError as exc:
        raise ClientError(codec.INVALID_PARAMS, f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ClientError(codec.INVALID_PARAMS, "not a regular file")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(max_bytes + 1)  # a file growing meanwhile is not read whole
    if len(data) > max_bytes:
        raise ClientError(codec.INVALID_PARAMS, f"file larger than {max_bytes} bytes")
    text = data.decode("utf-8", errors="replace")
    if isinstance(line, int) or isinstance(limit, int):
        lines = text.splitlines(keepends=True)
        start = max(line - 1, 0) if isinstance(line, int) else 0
        end = start + limit if isinstance(limit, int) and limit >= 0 else len(lines)
        text = "".join(lines[start:end])
    return text


def _process_umask() -> int:
    """The umask, read without changing it (Linux ``/proc``), else set and restored once."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _process_umask()


def _target_mode(dir_fd: int, name: str) -> int:
    """An existing file keeps its permission bits; a new one gets 0666 minus the umask
    (what ``open(..., "w")`` would give it, not ``mkstemp``'s 0600)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return 0o666 & ~_UMASK
    return 0o666 & ~_UMASK if stat.S_ISLNK(st.st_mode) else stat.S_IMODE(st.st_mode)


def _write(path: str, content: str, root: str) -> None:
    parts = parts_below(path, root)
    if not parts:
        raise IsADirectoryError(21, "Is a directory")
    name = parts[-1]
    dir_fd = beneath.open_dir(root, parts[:-1], create=True)
    try:
        mode = _target_mode(dir_fd, name)
        tmp = f".xwm-write-{secrets.token_hex(6)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(content)
            # rename(2) replaces a symlink at ``name`` itself, never what it points to
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


async def read_text_file(params: dict[str, Any], root: str | None, max_bytes: int) -> Any:
    path = resolve(params.get("path"), root)
    assert root is not None  # resolve() refused the path otherwise
    content = await asyncio.to_thread(
        _read, path, root, max_bytes, params.get("line"), params.get("limit")
    )
    return {"content": content}


async def write_text_file(params: dict[str, Any], root: str | None, max_bytes: int) -> Any:
    path = resolve(params.get("path"), root)
    content = params.get("content")
    if not isinstance(content, str):
        raise ClientError(codec.INVALID_PARAMS, "content must be a string")
    if len(content.encode()) > max_bytes:
        raise ClientError(codec.INVALID_PARAMS, f"content larger than {max_bytes} bytes")
    assert root is not None
    try:
        await asyncio.to_thread(_write, path, content, root)
    except OSError as exc:  # a directory there, a file as a parent, no permission, disk full
        raise ClientError(codec.INVALID_PARAMS, f"cannot write: {exc.strerror or exc}") from None
    return None
