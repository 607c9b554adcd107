"""``terminal/*`` served to agents — off unless ``agents.terminal_enabled``.

Commands run without a shell, in their own process group, in a directory inside
the session's confined working directory (opened without following a symlink, and
the child started in it by that fd: a swap after the check cannot lead outside),
with the agent's own clean environment (``launch.py``, never the bridge's) plus the
request's ``env`` items; output is capped (oldest bytes dropped, ``truncated: true``);
``wait_for_exit`` answers when the command's process exits, even if a background
process it left holds the output pipe open (the output written before the exit is
read first, for up to :data:`EXIT_DRAIN` seconds). A kill (``terminal/kill``,
``release``, a cancel, close) sends SIGKILL to the command's whole process group,
also after the command exited while its group still has members; until then such
leftovers count toward ``terminal_max_running``. Every terminal of a session is
killed on cancel and all of them on close. Under
``agents.sandbox: bwrap`` a command is sandboxed like the agent, with write access
to the session directory only. A terminal is forgotten when the agent releases it;
of the exited ones it never released (a cancelled turn, a crashed or careless
agent) the newest :data:`MAX_EXITED` are kept, so that they cannot pile up for the
daemon's life.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from xwm_bridge.beneath import open_dir
from xwm_bridge.config import AgentsConfig
from xwm_bridge.procgroups import group_outlives, kill_group
from xwm_bridge.providers.stdio import codec
from xwm_bridge.providers.stdio.agent import ClientError
from xwm_bridge.providers.stdio.client_fs import parts_below, resolve
from xwm_bridge.providers.stdio.launch import bwrap_argv, program_paths
from xwm_bridge.tasks import wait_for

_ids = itertools.count(1)
#: exited terminals kept that the agent has not released (their output, their status)
MAX_EXITED = 32
#: seconds ``wait_for_exit`` lets the output written before the exit arrive, at most,
#: when the pipe stays open after it (a background process of the command holds it)
EXIT_DRAIN = 0.25
#: where a child finds the directory fd it starts in (Linux); elsewhere: by name
#: seconds ``wait_for_exit`` waits for the command's exit after its SIGKILL (a process
#: stuck in the kernel, a hung NFS mount, does not die at once): then -32603
KILL_WAIT = 5.0
FD_DIR = "/proc/self/fd"
_BY_FD = os.path.isdir(FD_DIR)


def signal_name(number: int) -> str:
    """``SIGKILL``; a real-time signal has no ``signal.Signals`` member but
    ``SIGRTMIN`` and ``SIGRTMAX``: ``SIGRTMIN+6`` (``Signals(40)`` raised)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        low = getattr(signal, "SIGRTMIN", 0)
        return f"SIGRTMIN+{number - low}" if low and number > low else f"SIG{number}"


def _env_items(raw: Any) -> dict[str, str]:
    """The request's ``env`` (``[{name, value}]``; an item without a string ``name`` is
    skipped). A name with ``=`` or a NUL, or a value with a NUL, is ``-32602`` on both
    loops: asyncio's raised ValueError, uvloop cut at the NUL and passed ``B=C=v``."""
    if not raw:  # none, or empty (an agent sending {} meant no env)
        return {}
    if not isinstance(raw, list):  # iterating it raised TypeError (an internal error)
        raise ClientError(codec.INVALID_PARAMS, "env must be a list of {name, value}")
    out: dict[str, str] = {}
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        name, value = item["name"], str(item.get("value", ""))
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ClientError(
                codec.INVALID_PARAMS,
                "env names must be non-empty without = or NUL, and values without NUL",
            )
        out[name] = value
    return out


class Terminal(asyncio.SubprocessProtocol):
    """One command: its output, kept as it arrives (no reader task), and its exit.

    ``exited`` is set when the command's process exits, which is what
    ``wait_for_exit`` answers to (asyncio's ``Process.wait()`` on the default loop
    also waits for its pipes to close, which a background process can delay for
    ever); ``eof`` when its output pipe closes."""

    def __init__(self, session_id: str, limit: int, owner: object = None) -> None:
        loop = asyncio.get_running_loop()
        self.session_id = session_id
        #: what asked for it (the agent, :meth:`Terminals.release_owner`)
        self.owner = owner
        self.limit = limit
        self.output = bytearray()
        self.truncated = False
        self.transport: asyncio.SubprocessTransport | None = None
        self.exited: asyncio.Future[None] = loop.create_future()
        self.eof: asyncio.Future[None] = loop.create_future()
        #: its group got SIGKILL after the command exited: nothing of it is left
        self.group_killed = False

    # asyncio.SubprocessProtocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.SubprocessTransport, transport)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.append(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if not self.eof.done():
            self.eof.set_result(None)
        self._maybe_close()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)
        self._maybe_close()

    def _maybe_close(self) -> None:
        """Both done: nothing more comes (what asyncio's own protocol does)."""
        if self.exited.done() and self.eof.done() and self.transport is not None:
            self.transport.close()

    def append(self, data: bytes) -> None:
        self.output += data
        if len(self.output) > self.limit:
            del self.output[: len(self.output) - self.limit]
            self.truncated = True

    @property
    def pid(self) -> int:
        assert self.transport is not None
        return self.transport.get_pid()

    @property
    def returncode(self) -> int | None:
        return None if self.transport is None else self.transport.get_returncode()

    def exit_status(self) -> dict[str, Any] | None:
        code = self.returncode
        if code is None:
            return None
        if code < 0:
            return {"exitCode": None, "signal": signal_name(-code)}
        return {"exitCode": code, "signal": None}

    def running(self) -> bool:
        """The command, or what it left in its group after it exited."""
        if self.returncode is None:
            return True
        return not self.group_killed and group_outlives(self.pid)

    def kill(self) -> None:
        """SIGKILL to the command's group (its own: started in a new session), also
        after the command exited while its group has members left."""
        if self.transport is None:
            return
        if self.group_killed:
            return
        if kill_group(self.pid, reaped=self.returncode is not None):
            self.group_killed = True  # SIGKILL: none of them runs on

    def release(self) -> None:
        """Kill and let go: its pipe is closed, the loop keeps nothing of it."""
        self.kill()
        if self.transport is not None:
            self.transport.close()


class Terminals:
    def __init__(self, config: AgentsConfig) -> None:
        self._config = config
        self._terms: dict[str, Terminal] = {}
        #: creates past the cap check and not yet added (their spawn awaited): they
        #: count toward ``terminal_max_running``, or concurrent creates all passed it
        self._starting = 0

    async def handle(
        self,
        method: str,
        params: dict[str, Any],
        root: str | None,
        base_env: Mapping[str, str],
        owner: object = None,
    ) -> Any:
        """``base_env``: the agent's environment, the one its terminals start from;
        ``owner``: the agent asking (a terminal created now is released with it)."""
        if method == "terminal/create":
            return await self._create(params, root, base_env, owner)
        term = self._terms.get(str(params.get("terminalId", "")))
        if term is None or term.session_id != str(params.get("sessionId", "")):
            raise ClientError(codec.RESOURCE_NOT_FOUND, "Resource not found")
        if method == "terminal/output":
            out: dict[str, Any] = {
                "output": term.output.decode("utf-8", "replace"),
                "truncated": term.truncated,
            }
            status = term.exit_status()
            if status is not None:
                out["exitStatus"] = status
            return out
        if method == "terminal/wait_for_exit":
            try:  # shielded: a cancel or the timeout of this call leaves them be
                await wait_for(asyncio.shield(term.exited), self._config.prompt_timeout)
            except TimeoutError:
                term.kill()
                try:
                    await wait_for(asyncio.shield(term.exited), KILL_WAIT)
                except TimeoutError:
                    raise ClientError(
                        codec.INTERNAL_ERROR,
                        f"the command did not exit within {KILL_WAIT:g}s of its SIGKILL",
                    ) from None
            # the output written before the exit may still be in the pipe: read it
            # (until its end, or a little while when a background process holds it)
            await asyncio.wait([term.eof], timeout=EXIT_DRAIN)
            return term.exit_status()
        if method == "terminal/kill":
            term.kill()
            return None
        if method == "terminal/release":
            self._terms.pop(str(params.get("terminalId")), None)
            term.release()
            return None
        raise ClientError(codec.METHOD_NOT_FOUND, f"method not supported by this client: {method}")

    async def _create(
        self,
        params: dict[str, Any],
        root: str | None,
        base_env: Mapping[str, str],
        owner: object = None,
    ) -> dict[str, Any]:
        command = params.get("command")
        args = params.get("args") or []
        if not isinstance(command, str) or not command:
            raise ClientError(codec.INVALID_PARAMS, "command is required")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ClientError(codec.INVALID_PARAMS, "args must be a list of strings")
        if "\0" in command or any("\0" in a for a in args):  # uvloop would cut the string
            raise ClientError(codec.INVALID_PARAMS, "command and args must not contain NUL")
        cwd = resolve(params.get("cwd") or root, root)
        running = self._starting + sum(1 for t in self._terms.values() if t.running())
        if running >= self._config.terminal_max_running:
            raise ClientError(codec.INVALID_PARAMS, "too many running terminals")
        self._starting += 1
        try:
            return await self._start(params, root, base_env, owner, cwd)
        finally:
            self._starting -= 1

    async def _start(
        self,
        params: dict[str, Any],
        root: str | None,
        base_env: Mapping[str, str],
        owner: object,
        cwd: str,
    ) -> dict[str, Any]:
        """:meth:`_create` past the checks of the command and the cap."""
        command, args = params["command"], params.get("args") or []
        session_id = str(params.get("sessionId", ""))
        env = dict(base_env)  # never os.environ: the bridge's secrets stay with the bridge
        env.update(_env_items(params.get("env")))
        limit = self._config.terminal_output_limit
        asked = params.get("outputByteLimit")
        if isinstance(asked, int) and 0 < asked < limit:
            limit = asked
        argv = [command, *args]
        assert root is not None  # resolve() refused the command otherwise
        if self._config.sandbox == "bwrap":  # as confined as the agent that asked for it
            visible = program_paths(argv, env)
            # only the root is bound (it holds the cwd): bwrap binds by name, and a cwd
            # swapped since the check for a relative symlink out of the root would be
            # bound there, read-write, where the root's bind does not cover it
            argv = bwrap_argv(self._config.bwrap_path, argv, cwd, [root], visible, bind_cwd=False)
        # the checked directory, opened component by component without following a
        # symlink, is where the child starts: by its fd, not by its name again
        try:
            cwd_fd = open_dir(Path(root), parts_below(cwd, root))
        except OSError as exc:
            raise ClientError(
                codec.INVALID_PARAMS, f"cannot use cwd: {exc.strerror or exc}"
            ) from None
        term = Terminal(session_id, limit, owner)
        loop = asyncio.get_running_loop()
        try:
            await loop.subprocess_exec(
                lambda: term,
                *argv,
                # resolved in the child, which chdirs before exec: the fd is still open
                # there (close-on-exec) and names the directory it was opened on
                cwd=f"{FD_DIR}/{cwd_fd}" if _BY_FD else cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise ClientError(codec.INTERNAL_ERROR, f"cannot start command: {exc}") from None
        except ValueError as exc:  # a NUL in the command, its args or its env
            raise ClientError(codec.INVALID_PARAMS, f"cannot start command: {exc}") from None
        finally:
            os.close(cwd_fd)
        self._forget_exited()
        tid = f"term-{next(_ids)}"
        self._terms[tid] = term
        return {"terminalId": tid}

    def _forget_exited(self) -> None:
        """Make room for one more exited terminal: the oldest exited ones go."""
        exited = [tid for tid, t in self._terms.items() if not t.running()]
        for tid in exited[: max(0, len(exited) - MAX_EXITED + 1)]:
            self._terms.pop(tid).release()

    def kill_session(self, session_id: str) -> None:
        for term in self._terms.values():
            if term.session_id == session_id:
                term.kill()

    def release_owner(self, owner: object) -> None:
        """Kill and forget every terminal ``owner`` (an agent) created, in any session:
        its process is gone, and with it whatever could read or release them (a session
        whose turn had ended left its terminals to the agent)."""
        for tid, term in list(self._terms.items()):
            if term.owner is owner:
                self._terms.pop(tid).release()

    async def close(self) -> None:
        """Kill every command, wait (at most ``KILL_WAIT``) until each has exited and
        been reaped, then let go of them: a command reaped later was reaped by a loop
        that may be gone by then, and closing the transport of one not reaped yet made
        asyncio's own kill reap it behind its child watcher's back (exit status 255)."""
        terms = list(self._terms.values())
        self._terms.clear()
        for term in terms:
            term.kill()
        waiting = [term.exited for term in terms if not term.exited.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=KILL_WAIT)
        for term in terms:
            term.release()
