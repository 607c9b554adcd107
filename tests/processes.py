"""Processes as the tests see them (Linux: ``/proc``)."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """``pid`` runs (neither gone nor a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def processes_with(marker: str) -> list[int]:
    """PIDs whose environment carries ``marker`` (the agents a test started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


class ClosedStdin:
    """A child's stdin whose pipe the loop has already closed (the child exited without
    reading it): uvloop's transport raises RuntimeError on a write, asyncio's does not."""

    def __init__(self) -> None:
        self.closed = False

    def is_closing(self) -> bool:
        return True

    def write(self, data: bytes) -> None:
        raise RuntimeError("unable to perform operation on <WriteUnixTransport>: closed")

    async def drain(self) -> None:
        raise ConnectionResetError("closed")

    def close(self) -> None:
        self.closed = True
