"""One local ACP agent process: spawn, JSON-RPC over its stdio, restart after a crash.

The agent runs in its own process group (``start_new_session``) from an argv
without a shell; closing terminates the whole group (gemini re-launches itself
as a child, some agents ignore EOF). stdout is split by :class:`LineSplitter`
with a 64 MiB per-line limit; stderr is drained to the log line by line. The
agent's end is its process's exit, not its pipes' (a process it left may hold
them open for ever): what it wrote before is read (for up to :data:`EXIT_DRAIN`
seconds), what is left of its group is killed, and its pending calls fail.
Our request ids are integers from :class:`IdSpace`; requests *from* the agent
keep their own ids and are answered by the handler registered for their
``sessionId``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import inflight, jsonrpc, procgroups
from xwm_bridge.providers.stdio import codec
from xwm_bridge.providers.stdio.features import AgentFeatures
from xwm_bridge.tasks import Supervisor, wait_for

log = logging.getLogger("xwm_bridge.agents")

READ_CHUNK = 256 * 1024
WRITE_TIMEOUT = 30.0
STDERR_TAIL = 20
#: how long a call to a dead process waits to learn its exit status
EXIT_REPORT_WAIT = 2.0
#: seconds the output written before the agent exited may take to arrive, at most,
#: when its pipes stay open after the exit (a process it left holds them)
EXIT_DRAIN = 0.25
#: how long a turn that failed on its agent's exit waits for the requests the exit
#: cancelled to end (a withdrawn permission's resolution goes on the turn's stream)
WITHDRAWN_WAIT = 1.0
#: requests from the agent served at once; past it one is answered -32004 at once (a
#: runaway agent cannot pile up permission prompts or file reads without bound)
MAX_AGENT_REQUESTS = 64
#: lines that are not JSON-RPC, and refused requests: the first few are logged, then
#: one in this many (with the count), so a chatty agent does not flood the log
FIRST_LOGGED = 5
LOG_EVERY = 1000


def _worth_logging(count: int) -> bool:
    """Whether the ``count``-th occurrence of a repeated agent problem is logged."""
    return count <= FIRST_LOGGED or count % LOG_EVERY == 0


class AgentError(Exception):
    """A failed call to the agent; ``code`` is the JSON-RPC error code when it answered."""

    def __init__(self, message: str, code: int | None = None, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.timed_out = timed_out


class ClientError(Exception):
    """Raised by a request handler: answered to the agent as a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


OnUpdate = Callable[[dict[str, Any]], Awaitable[None]]
OnRequest = Callable[[str, dict[str, Any]], Awaitable[Any]]
#: the process exited on its own (how, with its stderr tail): called before the
#: agent's requests still being served are cancelled
OnExit = Callable[[str], None]


@dataclass(slots=True)
class SessionHandlers:
    on_update: OnUpdate
    on_request: OnRequest
    on_exit: OnExit | None = None


def spawn_failure(exc: OSError, argv: tuple[str, ...], cwd: str) -> str:
    """Why an agent could not be started (uvloop's error does not name the file: say
    which command, or which directory, it was)."""
    binary = argv[0] if argv else ""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)) and cwd and not os.path.isdir(cwd):
        # the chdir failed, not the exec: "command not found" sent people to PATH
        return f"working directory not found: {cwd}"
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {binary}"
    if isinstance(exc, PermissionError):
        return f"not executable: {binary}"
    return f"{binary}: {exc.strerror or exc}"


@dataclass(frozen=True, slots=True)
class AgentSpec:
    name: str
    argv: tuple[str, ...]
    #: the agent's whole environment (its API keys): never in a repr
    env: dict[str, str] = field(repr=False)
    cwd: str
    capabilities: dict[str, Any]
    protocol_version: int = codec.PROTOCOL_VERSION
    initialize_timeout: float = 60.0
    stop_grace: float = 3.0


class AcpAgent:
    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec
        self._proc: asyncio.subprocess.Process | None = None
        self._protocol: procgroups.Watch | None = None
        #: the running process's :meth:`_watch_exit` (close waits for it)
        self._watcher: asyncio.Task[None] | None = None
        #: the process's reader tasks and the agent's requests being served
        self._tasks = Supervisor()  # the process's pipe readers and its exit watcher
        #: the agent's requests being served (fs/*, terminal/*, permissions): a stop
        #: cancels them; the pipe tasks end with the pipes
        self._requests = Supervisor()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = codec.IdSpace()
        self._write_lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._stderr: deque[str] = deque(maxlen=STDERR_TAIL)
        self.sessions: dict[str, SessionHandlers] = {}
        #: called when the process is gone: it exited on its own (after each session's
        #: ``on_exit``) or was closed (:meth:`close`: the sandbox's process cap, the
        #: bridge's shutdown); the executor releases the terminals the agent created,
        #: idle sessions' too
        self.on_gone: OnExit | None = None
        #: calls holding this process now (the executor's ``acquire``): the sandbox's
        #: process cap closes only a process that none holds
        self.users = 0
        self.init_result: dict[str, Any] = {}
        #: bumped on every (re)start; ACP sessions of an older generation are gone.
        self.generation = 0
        self.last_exit: str = ""
        #: the last exit or start failure, with the stderr tail (operator health view)
        self.last_error: str = ""
        self.last_error_at = 0.0
        self.dropped_lines = 0
        #: lines that were not JSON-RPC messages, over the agent's life (all processes)
        self.bad_lines = 0
        #: requests from the agent being served now (at most MAX_AGENT_REQUESTS)
        self._serving = 0
        #: requests refused because MAX_AGENT_REQUESTS were being served
        self.refused_requests = 0
        #: the auth method this process was authenticated with ("" = not yet)
        self.authenticated = ""
        self._exited = asyncio.Event()
        self._exit_message = ""

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def features(self) -> AgentFeatures:
        return AgentFeatures.of(self.init_result)

    @property
    def can_load_session(self) -> bool:
        return self.features.load_session

    async def ensure_started(self) -> dict[str, Any]:
        """Start (or restart after a crash) and ``initialize``; return its result."""
        async with self._start_lock:
            if self.alive and self.init_result:
                return self.init_result
            await self._stop()
            await self._spawn()
            try:
                result = await self.call(
                    "initialize",
                    codec.initialize_params(self.spec.protocol_version, self.spec.capabilities),
                    self.spec.initialize_timeout,
                )
            except AgentError:
                await self._stop()
                raise
            self.init_result = result if isinstance(result, dict) else {}
            return self.init_result

    async def _spawn(self) -> None:
        env = dict(self.spec.env)  # the whole environment: nothing inherited (launch.py)
        try:
            proc, watch = await procgroups.start(
                *self.spec.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=self.spec.cwd or None,
                start_new_session=True,  # own process group, killed as a whole
            )
        except OSError as exc:
            why = spawn_failure(exc, self.spec.argv, self.spec.cwd)
            self._failed(f"cannot start agent {self.spec.name}: {why}")
            raise AgentError(f"cannot start agent {self.spec.name}: {why}") from None
        self._proc, self._protocol = proc, watch
        self.generation += 1
        self.authenticated = ""
        self._exited = asyncio.Event()
        self._exit_message = ""
        self._stderr.clear()
        log.info(
            "agent started",
            extra={"agent": self.spec.name, "pid": self._proc.pid, "generation": self.generation},
        )
        proc = self._proc
        readers = [
            self._tasks.spawn(self._read_stdout(proc), name=f"agent-stdout:{self.spec.name}"),
            self._tasks.spawn(self._read_stderr(proc), name=f"agent-stderr:{self.spec.name}"),
        ]
        self._watcher = self._tasks.spawn(
            self._watch_exit(proc, watch, readers), name=f"agent-exit:{self.spec.name}"
        )

    async def _not_running(self) -> AgentError:
        """The error for a call to a process that is gone: how it exited, once known."""
        if self._proc is not None:
            with contextlib.suppress(TimeoutError):
                await wait_for(self._exited.wait(), EXIT_REPORT_WAIT)
        if self._exit_message:
            return AgentError(self._exit_message)
        return AgentError(f"agent {self.spec.name} is not running{self._exit_suffix()}")

    async def call(self, method: str, params: dict[str, Any], deadline_s: float) -> Any:
        """Send a request and wait for its answer, at most ``deadline_s`` seconds."""
        if not self.alive:
            raise await self._not_running()
        rid = self._ids.next()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await self._write(codec.request(rid, method, params))
            return await wait_for(fut, deadline_s)
        except TimeoutError:
            raise AgentError(
                f"agent {self.spec.name} did not answer {method} within {deadline_s:g}s",
                timed_out=True,
            ) from None
        finally:
            self._pending.pop(rid, None)

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        if self.alive:
            await self._write(codec.notification(method, params))

    async def _write(self, data: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise AgentError(f"agent {self.spec.name} is not running")
        async with self._write_lock:
            try:
                if proc.stdin.is_closing():  # the pipe is gone: uvloop's write would
                    raise BrokenPipeError("the agent's stdin is closed")  # be RuntimeError
                proc.stdin.write(data)
                await wait_for(proc.stdin.drain(), WRITE_TIMEOUT)
            except OSError as exc:  # a closed pipe: say how the process ended, if it did
                error = await self._not_running()
                if not self._exit_message:
                    error = AgentError(f"cannot write to agent {self.spec.name}: {exc!r}")
                raise error from None
            except TimeoutError as exc:
                raise AgentError(f"cannot write to agent {self.spec.name}: {exc!r}") from None

    async def _read_stdout(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        splitter = codec.LineSplitter()
        while True:
            data = await proc.stdout.read(READ_CHUNK)
            if not data:
                return
            for line in splitter.feed(data):
                await self._on_line(line)
            if splitter.dropped != self.dropped_lines:
                self.dropped_lines = splitter.dropped
                log.warning(
                    "agent line over the size limit dropped", extra={"agent": self.spec.name}
                )

    async def _watch_exit(
        self,
        proc: asyncio.subprocess.Process,
        protocol: procgroups.Watch,
        readers: list[asyncio.Task[None]],
    ) -> None:
        """The process's end, when it exits (its pipes may stay open after it): what it
        wrote before is read (up to the pipes' end, at most :data:`EXIT_DRAIN` seconds
        when a process it left holds them), what is left of its group is killed, its
        pipes are closed, and the pending calls fail with how it ended."""
        await protocol.wait_exit()
        await asyncio.wait(readers, timeout=EXIT_DRAIN)
        if procgroups.kill_group(proc.pid, reaped=True):
            log.info("agent's leftover processes killed", extra={"agent": self.spec.name})
        protocol.close()  # the readers see the end even if a stranger holds the pipes
        await asyncio.wait(readers)
        code = proc.returncode
        self.last_exit = f"exit status {code}"
        tail = " | ".join(self._stderr)
        message = f"agent {self.spec.name} exited ({self.last_exit})" + (
            f": {tail[-500:]}" if tail else ""
        )
        if code != 0 and proc is self._proc:
            self._failed(message)
        # after a restart the pending calls belong to the new process: leave them
        if proc is self._proc or self._proc is None:
            self._exit_message = message
            self._exited.set()
            self.init_result = {}
            for fut in list(self._pending.values()):
                if not fut.done():
                    fut.set_exception(AgentError(message))
        if proc is self._proc:  # exited on its own (a stop cleans up after itself)
            self._withdraw(message)
        log.info("agent exited", extra={"agent": self.spec.name, "status": code})

    def _withdraw(self, message: str) -> None:
        """The process is gone: nobody reads the answers to its requests any more. Each
        session's ``on_exit`` first (a pending permission withdrawn as ``agent_exited``,
        its terminals released), then every request still being served is cancelled —
        at once, not at the next start or stop."""
        for handlers in list(self.sessions.values()):
            if handlers.on_exit is None:
                continue
            try:
                handlers.on_exit(message)
            except Exception:
                log.exception("agent exit handler failed", extra={"agent": self.spec.name})
        if self.on_gone is not None:
            try:
                self.on_gone(message)
            except Exception:
                log.exception("agent exit handler failed", extra={"agent": self.spec.name})
        for task in self._requests.tasks():
            task.cancel()

    async def _on_line(self, line: bytes) -> None:
        msg = codec.decode(line)
        if msg.kind == "response":
            fut = self._pending.get(msg.id) if isinstance(msg.id, int) else None
            if fut is None or fut.done():
                log.debug("unmatched agent response", extra={"agent": self.spec.name})
            elif msg.error is not None:
                code = msg.error.get("code")
                fut.set_exception(
                    AgentError(
                        str(msg.error.get("message") or "agent error"),
                        code if isinstance(code, int) else None,
                    )
                )
            else:
                fut.set_result(msg.result)
        elif msg.kind == "notification":
            handlers = self.sessions.get(str(msg.params.get("sessionId", "")))
            update = msg.params.get("update")
            if msg.method == "session/update" and handlers and isinstance(update, dict):
                await handlers.on_update(update)
        elif msg.kind == "request":
            if not inflight.admits(self._serving, msg.method, MAX_AGENT_REQUESTS):
                self.refused_requests += 1
                if _worth_logging(self.refused_requests):
                    extra = {"agent": self.spec.name, "method": msg.method}
                    log.warning(
                        "agent request refused: too many in flight",
                        extra={**extra, "refused": self.refused_requests},
                    )
                refusal = jsonrpc.dumps_line(inflight.refusal(msg.id, MAX_AGENT_REQUESTS))
                with contextlib.suppress(AgentError):
                    await self._write(refusal)
                return
            self._serving += 1
            task = self._requests.spawn(
                self._serve_request(msg), name=f"agent-request:{msg.method}"
            )
            task.add_done_callback(self._served)  # also when cancelled before it ran
        else:
            self._bad_line(msg.detail)

    def _bad_line(self, detail: str) -> None:
        self.bad_lines += 1
        if _worth_logging(self.bad_lines):
            extra = {"agent": self.spec.name, "error": detail, "bad_lines": self.bad_lines}
            log.warning("bad line from agent", extra=extra)

    def _served(self, _: asyncio.Task[None]) -> None:
        self._serving -= 1

    async def _serve_request(self, msg: codec.Incoming) -> None:
        handlers = self.sessions.get(str(msg.params.get("sessionId", "")))
        try:
            if handlers is None:
                raise ClientError(codec.INVALID_PARAMS, "unknown or inactive sessionId")
            reply = codec.response(msg.id, await handlers.on_request(msg.method, msg.params))
        except ClientError as exc:
            reply = codec.error_response(msg.id, exc.code, exc.message)
        except Exception:
            log.exception("agent request failed", extra={"method": msg.method})
            reply = codec.error_response(msg.id, codec.INTERNAL_ERROR, "internal error")
        with contextlib.suppress(AgentError):
            await self._write(reply)

    async def _read_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        splitter = codec.LineSplitter(64 * 1024)
        while True:
            data = await proc.stderr.read(READ_CHUNK)
            if not data:
                return
            for raw in splitter.feed(data):
                line = raw.decode("utf-8", "replace")[:2000]
                self._stderr.append(line)
                log.debug("agent stderr", extra={"agent": self.spec.name, "line": line})

    def _failed(self, message: str) -> None:
        self.last_error, self.last_error_at = message[:1000], time.time()

    def status(self) -> dict[str, Any]:
        """For the operator health view (issue 13)."""
        return {
            "running": self.alive,
            "pid": self._proc.pid if self.alive and self._proc is not None else None,
            "starts": self.generation,
            "restarts": max(0, self.generation - 1),
            "activeSessions": len(self.sessions),
            "busy": self.users > 0,
            "lastExit": self.last_exit or None,
            "lastError": self.last_error or None,
            "lastErrorAt": self.last_error_at or None,
        }

    def _exit_suffix(self) -> str:
        return f" ({self.last_exit})" if self.last_exit else ""

    async def _stop(self) -> None:
        proc, self._proc = self._proc, None
        protocol, self._protocol = self._protocol, None
        watcher, self._watcher = self._watcher, None
        if proc is not None and protocol is not None and proc.returncode is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
                try:  # its exit, not its pipes' end (a process it left may hold them)
                    await wait_for(protocol.wait_exit(), self.spec.stop_grace)
                    break
                except TimeoutError:
                    continue
        if proc is not None:
            # the group may outlive its leader (gemini's relaunched child): never a
            # signal for the number once the group is gone (it may be a stranger's)
            procgroups.kill_group(proc.pid, reaped=proc.returncode is not None)
        if watcher is not None:  # its end recorded (how it exited), its pipes closed
            await asyncio.wait([watcher], timeout=EXIT_DRAIN + 1)
        for task in self._requests.tasks():
            task.cancel()
        self.init_result = {}

    async def withdrawn_requests_ended(self) -> None:
        """Wait, at most :data:`WITHDRAWN_WAIT` seconds, for the requests an exit cancelled
        (:meth:`_withdraw`) to end: a withdrawn permission request still sends its
        resolution on its turn's stream as it ends, before the turn's failed answer."""
        cancelled = [t for t in self._requests.tasks() if t.cancelling()]
        if cancelled:
            await asyncio.wait(cancelled, timeout=WITHDRAWN_WAIT)

    async def close(self) -> None:
        await self._stop()
        await self._tasks.shutdown(0)
        await self._requests.shutdown(0)
        self.sessions.clear()
        if self.on_gone is not None:  # what it created goes with it (its terminals)
            try:
                self.on_gone("closed")
            except Exception:
                log.exception("agent exit handler failed", extra={"agent": self.spec.name})
