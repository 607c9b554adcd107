"""Processes the bridge starts (agents, terminal commands, skill commands, CLIs) and
their groups (each its own, ``start_new_session``): :func:`start` says when the
process exits, not only when its pipes close; whether a group outlives its leader;
a SIGKILL to what is left that never reaches a stranger's process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any, cast

#: the bytes a pipe's reader buffers (asyncio's ``create_subprocess_exec`` default)
STREAM_LIMIT = 2**16


class Watch(asyncio.subprocess.SubprocessStreamProtocol):
    """The protocol of asyncio's ``create_subprocess_exec``, plus ``exited``, set when
    the process exits: asyncio's ``Process.wait()`` on the default loop (not uvloop's)
    waits for its pipes to close as well, which a background process it left holding
    them can delay for ever."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=STREAM_LIMIT, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.transport = cast(asyncio.SubprocessTransport, transport)

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)

    async def wait_exit(self) -> None:
        """Until the process exits (its pipes may stay open); a cancel leaves
        ``exited`` be."""
        await asyncio.shield(self.exited)

    def close(self) -> None:
        """Our ends of its pipes closed (their readers see the end, whoever holds the
        other ends); the process killed if it still runs (asyncio's close)."""
        if self.transport is not None:
            self.transport.close()


async def start(*argv: str, **kwargs: Any) -> tuple[asyncio.subprocess.Process, Watch]:
    """``asyncio.create_subprocess_exec(*argv, **kwargs)`` and its :class:`Watch`."""
    loop = asyncio.get_running_loop()
    transport, watch = await loop.subprocess_exec(lambda: Watch(loop), *argv, **kwargs)
    return asyncio.subprocess.Process(transport, watch, loop), watch


def group_outlives(pgid: int) -> bool:
    """Whether the process group ``pgid``, led by a process that exited and was reaped,
    still has members (its background processes).

    POSIX (and Linux: a ``struct pid`` lives while any process uses its number as pid,
    pgid or sid) never gives a process the number of a group that still has members.
    So when some process has the number ``pgid`` again, the number was free, our
    group is gone, and that process (which may lead a group of its own) is a
    stranger's: no signal for it. When none has it, ``killpg(pgid, 0)`` reaches only
    our group's members. (Left: the number reused and made a group between this check
    and the kill, a wrap of the whole pid space within microseconds.) An output pipe
    still open is a sign of members, not proof of them (one may have handed it on to
    a process outside the group): it is not what this goes by."""
    try:
        os.kill(pgid, 0)
    except ProcessLookupError:
        pass
    except PermissionError:
        return False  # a process of another user has the number
    else:
        return False  # a process has the number again
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # members we may not signal (a setuid program)
    return True


def kill_group(pgid: int, reaped: bool) -> bool:
    """SIGKILL to the group ``pgid``: while its leader runs or is a zombie (not
    ``reaped``: its pid is still the group's number), or after it was reaped while the
    group has members left (:func:`group_outlives`). Whether the signal was sent.

    (On CPython's threaded child watcher the leader may be reaped a moment before its
    returncode is set: a window this has always had, as any killpg after asyncio
    reaps.)"""
    if reaped and not group_outlives(pgid):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
        return True
    return False
