"""Closed-loop HTTP load generator for the benchmarks; runs in its own process.

The orchestrator (``internal.bench.forwarding``) starts ``python -m
internal.bench.loadgen`` once and sends it one JSON object per line on stdin,
each describing a *cell*; the answer is one JSON object per line on stdout.
Running the client in its own process keeps its CPU out of the daemon's
event loop (on a 2-core machine they still share the cores: see the report).

Each of ``concurrency`` workers owns one keep-alive connection and, for
turns, one ``sessionId``/``threadId``, and sends its next request as soon as
the previous answer arrived. Two modes:

* duration: requests are sent for ``warmup + duration`` seconds; only answers
  that arrive inside the measurement window count (throughput, latency);
* count: ``count`` requests in total, each with a fresh session (memory phase).

Cell kinds: ``turn`` (``session.message``, plain JSON), ``stream`` (the same
turn with ``Accept: text/event-stream``: the SSE body is read as it arrives and
timed by :class:`internal.bench.streamed.StreamTimer`; every answer must hold
``chunks`` delta notifications and a successful result), ``caps``
(``acp.capabilities`` over HTTP) and ``ws_caps`` (``acp.capabilities`` over one
WebSocket per worker, ``websockets`` client, no compression).

Two HTTP clients (``internal.bench.clients``): ``raw`` (default) — a minimal
HTTP/1.1 client on asyncio streams (``Content-Length`` or chunked bodies),
several times cheaper per request than aiohttp's — and ``aiohttp``
(``ClientSession`` with a connector limit ≥ concurrency), kept for
cross-checking.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import websockets

from internal.bench.clients import AiohttpClient, Client, ProtocolError, RawHttpClient, WsClient
from internal.bench.procfs import cpu_seconds, machine_busy_seconds
from internal.bench.streamed import StreamTimer

ROUTING = {
    "routingMode": "explicit",
    "explicitExecutionTarget": "singleAgent",
    "explicitProviderId": "codex",
}
PROMPT = "benchmark turn"


@dataclass(frozen=True, slots=True)
class Cell:
    url: str
    #: "turn" / "stream" (session.message, plain JSON / SSE), "caps" / "ws_caps"
    #: (acp.capabilities over HTTP / one WebSocket per worker)
    kind: str = "turn"
    concurrency: int = 1
    warmup: float = 1.0
    duration: float = 4.0
    #: > 0: send exactly this many requests, each with a fresh session (no window).
    count: int = 0
    token: str = ""
    session_prefix: str = "bench"
    client: str = "raw"
    #: processes whose CPU time is sampled at the start and end of the window.
    pids: tuple[int, ...] = ()
    #: seconds to let in-flight requests finish after the window before cancelling.
    grace: float = 10.0
    #: count mode: give up after this long.
    max_time: float = 240.0
    #: the turns' ``taskPrompt``
    prompt: str = PROMPT
    #: stream: the delta notifications each answer must hold (0: not checked)
    chunks: int = 0

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Cell:
        obj = dict(obj)
        obj["pids"] = tuple(obj.get("pids", ()))
        return cls(**obj)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One answer: its latency and problem ('' = success); timings of a streamed one."""

    latency: float
    problem: str
    first_event: float | None = None
    first_delta: float | None = None
    notifications: int = 0
    deltas: int = 0


@dataclass(slots=True)
class Tally:
    latencies: list[float] = field(default_factory=list)
    first_events: list[float] = field(default_factory=list)
    first_deltas: list[float] = field(default_factory=list)
    notifications: int = 0
    deltas: int = 0
    errors: int = 0
    first_error: str = ""

    def add(self, outcome: Outcome) -> None:
        if outcome.problem:
            self.error(outcome.problem)
            return
        self.latencies.append(outcome.latency)
        if outcome.first_event is not None:
            self.first_events.append(outcome.first_event)
        if outcome.first_delta is not None:
            self.first_deltas.append(outcome.first_delta)
        self.notifications += outcome.notifications
        self.deltas += outcome.deltas

    def error(self, text: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = text[:300]


def _body(kind: str, rid: int, session_id: str, prompt: str = PROMPT) -> bytes:
    if kind in ("caps", "ws_caps"):
        return orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": "acp.capabilities"})
    params = {
        "sessionId": session_id,
        "threadId": session_id,
        "taskPrompt": prompt,
        "routing": ROUTING,
    }
    return orjson.dumps(
        {"jsonrpc": "2.0", "id": rid, "method": "session.message", "params": params}
    )


def _check(kind: str, status: int, data: bytes) -> str:
    """'' when the answer is the expected success, else a short description."""
    if status != 200:
        return f"HTTP {status}: {data[:200]!r}"
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return f"not JSON: {data[:200]!r}"
    result = obj.get("result") if isinstance(obj, dict) else None
    if not isinstance(result, dict):
        return f"no result: {data[:200]!r}"
    if kind == "turn" and result.get("success") is not True:
        return f"turn failed: {data[:300]!r}"
    return ""


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


async def run_cell(cell: Cell) -> dict[str, Any]:
    accept = "text/event-stream" if cell.kind == "stream" else "application/json"
    headers = {"Content-Type": "application/json", "Accept": accept}
    if cell.token:
        headers["Authorization"] = f"Bearer {cell.token}"
    session: aiohttp.ClientSession | None = None
    make: Callable[[], Client]
    if cell.kind == "ws_caps":
        auth = {k: v for k, v in headers.items() if k == "Authorization"}

        def make() -> Client:
            return WsClient(cell.url, auth)
    elif cell.client == "aiohttp":
        connector = aiohttp.TCPConnector(limit=cell.concurrency + 8, limit_per_host=0)
        session = aiohttp.ClientSession(connector=connector, trust_env=False)
        http = session

        def make() -> Client:
            return AiohttpClient(http, cell.url, headers)
    else:

        def make() -> Client:
            return RawHttpClient(cell.url, headers)

    try:
        if cell.count > 0:
            return await _run_count(cell, make)
        return await _run_window(cell, make)
    finally:
        if session is not None:
            await session.close()


_TRANSPORT_ERRORS = (
    OSError,
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
    ProtocolError,
    ValueError,
    aiohttp.ClientError,
    websockets.WebSocketException,
)


async def _one(cell: Cell, client: Client, rid: int, session_id: str) -> Outcome:
    body = _body(cell.kind, rid, session_id, cell.prompt)
    started = time.perf_counter()
    if cell.kind == "stream":
        timer = StreamTimer(started)
        try:
            status = await client.post_stream(body, timer)
        except _TRANSPORT_ERRORS as exc:
            return Outcome(time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
        elapsed = time.perf_counter() - started
        problem = f"HTTP {status}" if status != 200 else timer.verdict(cell.chunks)
        return Outcome(
            elapsed,
            problem,
            timer.first_event,
            timer.first_delta,
            timer.notifications,
            timer.deltas,
        )
    try:
        status, data = await client.post(body)
    except _TRANSPORT_ERRORS as exc:
        return Outcome(time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
    elapsed = time.perf_counter() - started
    return Outcome(elapsed, _check(cell.kind, status, data))


async def _gather_bounded(workers: list[Awaitable[None]], deadline: float) -> int:
    """Run the workers; cancel those still running at ``deadline``; return how many were."""
    tasks = [asyncio.ensure_future(w) for w in workers]
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5)
    for task in tasks:
        if task.done() and not task.cancelled():
            exc = task.exception()
            if exc is not None:
                raise exc
    return len(pending)


async def _run_window(cell: Cell, make: Callable[[], Client]) -> dict[str, Any]:
    tally = Tally()
    t_start = time.perf_counter()
    t0 = t_start + cell.warmup
    t1 = t0 + cell.duration
    cpu: dict[str, dict[int, float]] = {}
    own: dict[str, float] = {}

    async def sampler() -> None:
        await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        cpu["start"] = {pid: cpu_seconds(pid) for pid in cell.pids}
        own["start"], own["busy_start"] = time.process_time(), machine_busy_seconds()
        await asyncio.sleep(max(0.0, t1 - time.perf_counter()))
        cpu["end"] = {pid: cpu_seconds(pid) for pid in cell.pids}
        own["end"], own["busy_end"] = time.process_time(), machine_busy_seconds()

    async def worker(index: int) -> None:
        client = make()
        session_id = f"{cell.session_prefix}-w{index}"
        rid = index * 1_000_000
        try:
            while time.perf_counter() < t1:
                rid += 1
                outcome = await _one(cell, client, rid, session_id)
                done = time.perf_counter()
                if t0 <= done <= t1:
                    tally.add(outcome)
                if outcome.problem:
                    await asyncio.sleep(0.01)  # a refused connection must not spin
        finally:
            await client.close()

    sampling = asyncio.ensure_future(sampler())
    unfinished = await _gather_bounded(
        [worker(i) for i in range(cell.concurrency)], t1 + cell.grace
    )
    await sampling
    return _summary(cell, tally, cell.duration, unfinished, cpu, own)


async def _run_count(cell: Cell, make: Callable[[], Client]) -> dict[str, Any]:
    tally = Tally()
    next_index = 0
    started = time.perf_counter()
    cpu: dict[str, dict[int, float]] = {"start": {pid: cpu_seconds(pid) for pid in cell.pids}}
    own = {"start": time.process_time(), "busy_start": machine_busy_seconds()}

    async def worker() -> None:
        nonlocal next_index
        client = make()
        try:
            while next_index < cell.count:
                index = next_index
                next_index += 1
                outcome = await _one(cell, client, index + 1, f"{cell.session_prefix}-{index}")
                tally.add(outcome)
                if outcome.problem:
                    await asyncio.sleep(0.01)
        finally:
            await client.close()

    unfinished = await _gather_bounded(
        [worker() for _ in range(cell.concurrency)], started + cell.max_time
    )
    cpu["end"] = {pid: cpu_seconds(pid) for pid in cell.pids}
    own["end"], own["busy_end"] = time.process_time(), machine_busy_seconds()
    return _summary(cell, tally, time.perf_counter() - started, unfinished, cpu, own)


def _summary(
    cell: Cell,
    tally: Tally,
    window: float,
    unfinished: int,
    cpu: dict[str, dict[int, float]],
    own: dict[str, float],
) -> dict[str, Any]:
    lat = sorted(tally.latencies)
    completed = len(lat)
    start, end = cpu.get("start", {}), cpu.get("end", {})
    first_events, first_deltas = sorted(tally.first_events), sorted(tally.first_deltas)
    return {
        "completed": completed,
        "errors": tally.errors,
        "first_error": tally.first_error,
        "unfinished": unfinished,
        "window_s": window,
        "per_s": completed / window if window > 0 else 0.0,
        "p50_ms": _percentile(lat, 0.50) * 1000,
        "p99_ms": _percentile(lat, 0.99) * 1000,
        "max_ms": (lat[-1] * 1000) if lat else float("nan"),
        # streamed turns: time to the first data: event / first delta chunk, and counts
        "first_event_p50_ms": _percentile(first_events, 0.50) * 1000,
        "first_chunk_p50_ms": _percentile(first_deltas, 0.50) * 1000,
        "first_chunk_p99_ms": _percentile(first_deltas, 0.99) * 1000,
        "notifications": tally.notifications,
        "deltas": tally.deltas,
        "cpu_s": {str(pid): end.get(pid, 0.0) - start.get(pid, 0.0) for pid in cell.pids},
        "client_cpu_s": own.get("end", 0.0) - own.get("start", 0.0),
        #: every process on the machine, for telling how much CPU others took
        "machine_busy_s": own.get("busy_end", 0.0) - own.get("busy_start", 0.0),
    }


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            return
        try:
            answer = await run_cell(Cell.from_json(orjson.loads(line)))
        except Exception as exc:  # report, keep serving
            answer = {"fatal": f"{type(exc).__name__}: {exc}"}
        sys.stdout.buffer.write(orjson.dumps(answer) + b"\n")
        sys.stdout.buffer.flush()


def main() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve())


if __name__ == "__main__":
    main()
