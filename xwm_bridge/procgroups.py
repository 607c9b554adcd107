"""Process groups the bridge started (an agent's, a terminal command's: each its own,
``start_new_session``): whether one outlives its leader, and a SIGKILL to what is left
that never reaches a stranger's process."""

from __future__ import annotations

import contextlib
import os
import signal


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
