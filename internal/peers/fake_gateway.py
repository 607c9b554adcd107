"""Fake OpenClaw gateway for integration tests (tests only, loopback only).

Speaks the real handshake (``connect.challenge`` → ``connect`` → ``hello-ok``,
protocol 3..4 negotiation, shared-token auth with OpenClaw's error codes and
close codes) and a few methods: ``health``, ``status``, ``sessions.list``,
``chat.send`` (streams ``chat``/``agent`` events like OpenClaw: status →
delta → final, broadcast to every connection), ``chat.abort``.

Fault injection, set on :class:`FakeGatewayState` (or ``POST``-free: tests
hold the object):

* ``protocol`` — the version this gateway speaks (a client whose range misses
  it gets ``PROTOCOL_MISMATCH`` and close 1002);
* ``fail_next`` — method → error dict answered once instead of the result;
* ``drop_after_connect`` — close the socket right after hello-ok;
* ``close_after_challenge`` — this many times, write the challenge and a close
  frame in one TCP write (the client reads the challenge off a closing socket);
* ``silent`` — stop sending anything (ticks included) after hello-ok;
* ``reply_delay`` — seconds before any response;
* ``hold_hello`` — an event hello-ok waits for (``connects`` counts the waiting client);
* ``no_challenge`` — never send the challenge;
* ``handshake_noise`` — messages written as they are (text for ``str``, binary for
  ``bytes``) before the challenge and again before hello-ok: frames a client must
  drop while it waits for the challenge and for its ``connect`` response;
* ``seq_gap`` — skip this many sequence numbers once;
* ``chat_delay`` — seconds between streamed chat events;
* ``text_only`` — ignore binary frames, as gateways that read only text frames do
  (``binary_frames`` counts the binary frames received either way);
* ``send_raw()`` — write arbitrary messages (bad JSON, binary, odd types);
* ``shutdown()`` — broadcast a ``shutdown`` event then close all sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.asyncio.server import Server, ServerConnection, serve

TOKEN = "gateway-secret"


@dataclass
class FakeGatewayState:
    token: str = TOKEN
    protocol: int = 4
    tick_interval_ms: int = 30_000
    fail_next: dict[str, dict[str, Any]] = field(default_factory=dict)
    drop_after_connect: int = 0
    close_after_challenge: int = 0
    silent: bool = False
    reply_delay: float = 0.0
    hold_hello: asyncio.Event | None = None
    no_challenge: bool = False
    handshake_noise: list[str | bytes] = field(default_factory=list)
    seq_gap: int = 0
    chat_delay: float = 0.01
    text_only: bool = False
    binary_frames: int = 0
    connects: int = 0
    handshakes_ok: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    aborted: set[str] = field(default_factory=set)
    connections: set[ServerConnection] = field(default_factory=set)
    seq: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def next_seq(self) -> int:
        self.seq += 1 + self.seq_gap
        self.seq_gap = 0
        return self.seq


class FakeGateway:
    def __init__(self, state: FakeGatewayState | None = None) -> None:
        self.state = state or FakeGatewayState()
        self._server: Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        self._server = await serve(self._handle, "127.0.0.1", port, max_size=4 * 1024 * 1024)
        self.port = next(iter(self._server.sockets)).getsockname()[1]

    async def stop(self) -> None:
        for task in list(self.state.tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def shutdown(self, restart_expected_ms: int = 1000) -> None:
        """What OpenClaw does on restart: a ``shutdown`` event, then the sockets close."""
        await self._broadcast("shutdown", {"reason": "restart", "restartExpectedMs": 1000})
        for ws in list(self.state.connections):
            with contextlib.suppress(Exception):
                await ws.close(1012, "service restart")

    async def send_raw(self, *messages: str | bytes) -> None:
        """Write each message as it is (text for ``str``, binary for ``bytes``) to every
        connection: frames a real gateway should never send."""
        for ws in list(self.state.connections):
            for message in messages:
                with contextlib.suppress(Exception):
                    await ws.send(message)

    async def _broadcast(self, event: str, payload: dict[str, Any]) -> None:
        frame = orjson.dumps(
            {"type": "event", "event": event, "payload": payload, "seq": self.state.next_seq()}
        ).decode()
        for ws in list(self.state.connections):
            with contextlib.suppress(Exception):
                await ws.send(frame)

    async def _handle(self, ws: ServerConnection) -> None:
        st = self.state
        st.connects += 1
        challenge = orjson.dumps(
            {
                "type": "event",
                "event": "connect.challenge",
                "payload": {"nonce": f"nonce-{st.connects}", "ts": int(time.time() * 1000)},
            }
        )
        if st.close_after_challenge > 0:
            st.close_after_challenge -= 1
            ws.protocol.send_text(challenge)
            ws.protocol.send_close(1012, "service restart")
            ws.transport.write(b"".join(ws.protocol.data_to_send()))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.wait_closed(), 5)
            return
        for message in st.handshake_noise:
            await ws.send(message)
        if not st.no_challenge:
            await ws.send(challenge.decode())
        try:
            first = orjson.loads(await asyncio.wait_for(ws.recv(), 15))
        except Exception:  # timeout, bad JSON or a client that left
            return
        if not await self._handshake(ws, first):
            return
        st.connections.add(ws)
        ticker = asyncio.get_running_loop().create_task(self._tick(ws))
        st.tasks.add(ticker)
        try:
            if st.drop_after_connect > 0:
                st.drop_after_connect -= 1
                await ws.close(1001, "dropped")
                return
            async for raw in ws:
                if isinstance(raw, bytes):
                    st.binary_frames += 1
                    if st.text_only:
                        continue
                try:
                    req = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(req, dict) and req.get("type") == "req":
                    task = asyncio.get_running_loop().create_task(self._serve(ws, req))
                    st.tasks.add(task)
                    task.add_done_callback(st.tasks.discard)
        except Exception:  # a dropped client is normal here
            return
        finally:
            st.connections.discard(ws)
            ticker.cancel()
            st.tasks.discard(ticker)

    async def _handshake(self, ws: ServerConnection, req: Any) -> bool:
        st = self.state
        rid = req.get("id") if isinstance(req, dict) else None
        if not isinstance(req, dict) or req.get("method") != "connect":
            await self._error(ws, rid, "INVALID_REQUEST", "first request must be connect")
            await ws.close(1008, "invalid request")
            return False
        params = req.get("params") or {}
        if not params.get("minProtocol", 0) <= st.protocol <= params.get("maxProtocol", 0):
            await self._error(ws, rid, "PROTOCOL_MISMATCH", "protocol mismatch")
            await ws.close(1002, "protocol mismatch")
            return False
        token = (params.get("auth") or {}).get("token", "")
        if not token:
            await self._error(
                ws,
                rid,
                "INVALID_REQUEST",
                "device identity required",
                {"code": "DEVICE_IDENTITY_REQUIRED"},
            )
            await ws.close(1008, "device identity required")
            return False
        if token != st.token:
            await self._error(
                ws,
                rid,
                "INVALID_REQUEST",
                "unauthorized: gateway token mismatch",
                {"code": "AUTH_TOKEN_MISMATCH"},
            )
            await ws.close(1008, "unauthorized")
            return False
        if st.reply_delay:
            await asyncio.sleep(st.reply_delay)
        if st.hold_hello is not None:
            await st.hold_hello.wait()
        for message in st.handshake_noise:
            await ws.send(message)
        st.handshakes_ok += 1
        await self._send(
            ws,
            {
                "type": "res",
                "id": rid,
                "ok": True,
                "payload": {
                    "type": "hello-ok",
                    "protocol": st.protocol,
                    "server": {"version": "fake", "host": "fake-gateway"},
                    "features": {"methods": ["health", "status", "chat.send"], "events": []},
                    "snapshot": {"sessionDefaults": {"mainSessionKey": "agent:main:main"}},
                    "policy": {"maxPayload": 4194304, "tickIntervalMs": st.tick_interval_ms},
                    "auth": {"role": "operator", "scopes": params.get("scopes") or []},
                },
            },
        )
        return True

    async def _tick(self, ws: ServerConnection) -> None:
        while True:
            await asyncio.sleep(self.state.tick_interval_ms / 1000)
            if not self.state.silent:
                await self._event(ws, "tick", {"ts": int(time.time() * 1000)})

    async def _send(self, ws: ServerConnection, frame: dict[str, Any]) -> None:
        if self.state.silent:
            return
        with contextlib.suppress(Exception):
            await ws.send(orjson.dumps(frame).decode())

    async def _event(self, ws: ServerConnection, event: str, payload: dict[str, Any]) -> None:
        await self._send(
            ws, {"type": "event", "event": event, "payload": payload, "seq": self.state.next_seq()}
        )

    async def _error(
        self,
        ws: ServerConnection,
        rid: Any,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if details:
            error["details"] = details
        with contextlib.suppress(Exception):
            await ws.send(
                orjson.dumps({"type": "res", "id": rid, "ok": False, "error": error}).decode()
            )

    async def _serve(self, ws: ServerConnection, req: dict[str, Any]) -> None:
        st = self.state
        st.requests.append(req)
        rid, method = req.get("id"), str(req.get("method"))
        params = req.get("params") or {}
        if st.reply_delay:
            await asyncio.sleep(st.reply_delay)
        failure = st.fail_next.pop(method, None)
        if failure is not None:
            await self._error(
                ws,
                rid,
                failure.get("code", "UNAVAILABLE"),
                failure.get("message", "injected failure"),
                failure.get("details"),
            )
            return
        if method == "chat.send":
            run_id = str(params.get("idempotencyKey") or f"run-{time.time_ns()}")
            await self._send(
                ws,
                {
                    "type": "res",
                    "id": rid,
                    "ok": True,
                    "payload": {"runId": run_id, "status": "started"},
                },
            )
            task = asyncio.get_running_loop().create_task(self._run_chat(params, run_id))
            st.tasks.add(task)
            task.add_done_callback(st.tasks.discard)
            return
        if method == "chat.abort":
            run_id = str(params.get("runId"))
            st.aborted.add(run_id)
            await self._send(
                ws,
                {
                    "type": "res",
                    "id": rid,
                    "ok": True,
                    "payload": {"ok": True, "aborted": True, "runIds": [run_id]},
                },
            )
            return
        payloads: dict[str, Any] = {
            "health": {"ok": True, "ts": int(time.time() * 1000)},
            "status": {"sessions": {"count": 0}, "version": "fake"},
            "sessions.list": {"sessions": [], "count": 0},
        }
        if method not in payloads:
            await self._error(ws, rid, "INVALID_REQUEST", f"unknown method: {method}")
            return
        await self._send(ws, {"type": "res", "id": rid, "ok": True, "payload": payloads[method]})

    async def _run_chat(self, params: dict[str, Any], run_id: str) -> None:
        st = self.state
        key = str(params.get("sessionKey") or "agent:main:main")
        text = str(params.get("message") or "")
        delay = st.chat_delay
        if text.startswith("slow:"):
            head, _, text = text.partition(" ")
            delay = max(delay, int(head[5:]) / 1000 / 3)
        if text.startswith("tool:"):
            await self._broadcast(
                "agent",
                {
                    "runId": run_id,
                    "sessionKey": key,
                    "stream": "tool",
                    "data": {"phase": "start", "name": "read", "toolCallId": "t1"},
                },
            )
        base = {"runId": run_id, "sessionKey": key}
        await self._broadcast("chat", {**base, "state": "status", "phase": "starting_model"})
        reply = f"FAKE-GW says: {text}"
        words = reply.split(" ")
        sent = ""
        for i, word in enumerate(words):
            await asyncio.sleep(delay)
            if run_id in st.aborted:
                await self._broadcast(
                    "chat",
                    {
                        **base,
                        "state": "aborted",
                        "stopReason": "aborted",
                        "message": _assistant(sent),
                    },
                )
                return
            piece = word if i == 0 else " " + word
            sent += piece
            await self._broadcast(
                "agent", {**base, "stream": "assistant", "data": {"text": sent, "delta": piece}}
            )
            await self._broadcast(
                "chat", {**base, "state": "delta", "deltaText": piece, "message": _assistant(sent)}
            )
        await self._broadcast(
            "chat", {**base, "state": "final", "stopReason": "stop", "message": _assistant(sent)}
        )


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


async def _main(args: argparse.Namespace) -> None:
    gw = FakeGateway(FakeGatewayState(token=args.token, protocol=args.protocol))
    await gw.start(args.port)
    print(f"listening 127.0.0.1:{gw.port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await gw.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="fake OpenClaw gateway (tests only)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default=TOKEN)
    parser.add_argument("--protocol", type=int, default=4)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
