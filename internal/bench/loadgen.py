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

Two clients: ``raw`` (default) — a minimal HTTP/1.1 client on asyncio streams
(``Content-Length`` or chunked bodies), several times cheaper per request than
aiohttp's — and ``aiohttp`` (``ClientSession`` with a connector limit ≥
concurrency), kept for cross-checking.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import orjson

from internal.bench.procfs import cpu_seconds, machine_busy_seconds

ROUTING = {
    "routingMode": "explicit",
    "explicitExecutionTarget": "singleAgent",
    "explicitProviderId": "codex",
}
PROMPT = "benchmark turn"


class ProtocolError(Exception):
    pass


class Client(Protocol):
    async def post(self, body: bytes) -> tuple[int, bytes]: ...

    async def close(self) -> None: ...


class RawHttpClient:
    """One keep-alive HTTP/1.1 connection that POSTs to one path."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        lines = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {self._host}:{self._port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._reader, self._writer
        try:
            writer.write(self._head + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = -1
            chunked = close = False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding":
                    chunked = b"chunked" in value.lower()
                elif name == b"connection":
                    close = b"close" in value.lower()
            if chunked:
                data = await self._read_chunked(reader)
            elif length >= 0:
                data = await reader.readexactly(length)
            else:
                raise ProtocolError("response has neither Content-Length nor chunked body")
        except BaseException:
            await self.close()
            raise
        if close:
            await self.close()
        return status, data

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers expected
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()


class AiohttpClient:
    def __init__(self, session: aiohttp.ClientSession, url: str, headers: dict[str, str]):
        self._session = session
        self._url = url
        self._headers = headers

    async def post(self, body: bytes) -> tuple[int, bytes]:
        async with self._session.post(self._url, data=body, headers=self._headers) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Cell:
    url: str
    kind: str = "turn"  # "turn" (session.message) or "caps" (acp.capabilities)
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

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Cell:
        obj = dict(obj)
        obj["pids"] = tuple(obj.get("pids", ()))
        return cls(**obj)


@dataclass(slots=True)
class Tally:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""

    def error(self, text: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = text[:300]


def _body(kind: str, rid: int, session_id: str) -> bytes:
    if kind == "caps":
        return orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": "acp.capabilities"})
    params = {
        "sessionId": session_id,
        "threadId": session_id,
        "taskPrompt": PROMPT,
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
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if cell.token:
        headers["Authorization"] = f"Bearer {cell.token}"
    session: aiohttp.ClientSession | None = None
    make: Callable[[], Client]
    if cell.client == "aiohttp":
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


async def _one(cell: Cell, client: Client, rid: int, session_id: str) -> tuple[float, str]:
    body = _body(cell.kind, rid, session_id)
    started = time.perf_counter()
    try:
        status, data = await client.post(body)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        return time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
    except (ProtocolError, ValueError, aiohttp.ClientError) as exc:
        return time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
    elapsed = time.perf_counter() - started
    return elapsed, _check(cell.kind, status, data)


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
                latency, problem = await _one(cell, client, rid, session_id)
                done = time.perf_counter()
                if t0 <= done <= t1:
                    if problem:
                        tally.error(problem)
                    else:
                        tally.latencies.append(latency)
                if problem:
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
                latency, problem = await _one(
                    cell, client, index + 1, f"{cell.session_prefix}-{index}"
                )
                if problem:
                    tally.error(problem)
                    await asyncio.sleep(0.01)
                else:
                    tally.latencies.append(latency)
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
